"""Crons of the LangGraph API: runs started on a schedule by whichever worker claims them.

A due cron is claimed with `FOR UPDATE SKIP LOCKED`; the claim advances `next_run_at` and
records the firing (unique by cron and due time) in one transaction, so a due time fires
once however many workers poll. The run is then created like any API run; a firing whose
worker died before that is started again by the next poll. Missed due times (no worker was
up) collapse into one firing. Schedules are cron expressions (five fields, or six with
seconds last) in the cron's `timezone`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from psycopg.types.json import Jsonb

from server.auth import Principal
from server.db.pool import Pool
from server.errors import InvalidGraphRequestError, LangGraphItemNotFoundError
from server.ids import new_id
from server.langgraph_api.assistant_book import AssistantBook
from server.langgraph_api.graphs import GraphRegistry
from server.langgraph_api.threads import ThreadKeeper
from server.timestamps import iso

log = logging.getLogger(__name__)
# How long a firing may wait for its run before another worker starts it.
STALE_FIRING_S = 60
_RUN_FIELDS = (
    "input",
    "config",
    "context",
    "metadata",
    "interrupt_before",
    "interrupt_after",
    "webhook",
    "multitask_strategy",
    "stream_mode",
    "stream_subgraphs",
    "durability",
)


def next_time(schedule: str, timezone: str, after: datetime) -> datetime:
    """Return the first time after `after` that `schedule` names, in UTC.

    Raises:
        InvalidGraphRequestError: the schedule or the time zone is not valid.
    """
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidGraphRequestError(f"unknown time zone {timezone!r}") from exc
    if not croniter.is_valid(schedule):
        raise InvalidGraphRequestError(
            f"schedule {schedule!r} is not a cron expression, e.g. '*/5 * * * *'"
        )
    found = croniter(schedule, after.astimezone(zone)).get_next(datetime)
    return found.astimezone(UTC)  # type: ignore[no-any-return]


def cron_view(row: dict[str, Any]) -> dict[str, Any]:
    """Return a cron as LangGraph's `Cron`."""
    return {
        "cron_id": row["cron_id"],
        "assistant_id": row["assistant_id"],
        "thread_id": row["thread_id"],
        "schedule": row["schedule"],
        "timezone": row["timezone"],
        "payload": row["payload"],
        "metadata": row["metadata"],
        "enabled": row["enabled"],
        "end_time": iso(row["end_time"]),
        "next_run_date": iso(row["next_run_at"]),
        "user_id": row["user_id"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
    }


@dataclass(frozen=True)
class CronBook:
    """The caller's crons."""

    pool: Pool
    graphs: GraphRegistry
    who: Principal

    async def create(self, thread_id: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """Create a cron on `thread_id` (a new thread per firing when None).

        `on_run_completed: delete` (the default) deletes each firing's new thread once its run has
        ended.
        """
        # A graph id, its default assistant's id, or an assistant created through the API.
        book = AssistantBook(self.pool, self.graphs, self.who)
        assistant, _ = await book.named(str(body.get("assistant_id") or ""))
        assistant_id = str(assistant["assistant_id"])
        schedule, zone = str(body.get("schedule") or ""), str(body.get("timezone") or "UTC")
        first = next_time(schedule, zone, datetime.now(UTC))
        if thread_id is not None:
            async with self.pool.connection() as conn:
                await ThreadKeeper(self.pool, self.graphs, self.who).row(conn, thread_id)
        payload = {k: body[k] for k in _RUN_FIELDS if body.get(k) is not None}
        payload["assistant_id"] = assistant_id  # each firing runs with the assistant's config
        if thread_id is None and (body.get("on_run_completed") or "delete") == "delete":
            payload["on_completion"] = "delete"  # each firing's new thread, once its run ends
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO lg_crons (cron_id, tenant_id, user_id, roles, thread_id,"
                " assistant_id, schedule, timezone, payload, metadata, enabled, end_time,"
                " next_run_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " RETURNING *",
                (
                    new_id("cron"),
                    self.who.tenant_id,
                    self.who.user_id,
                    sorted(self.who.roles),
                    thread_id,
                    assistant_id,
                    schedule,
                    zone,
                    Jsonb(payload),
                    Jsonb(body.get("metadata") or {}),
                    body.get("enabled", True) is not False,
                    body.get("end_time"),
                    first,
                ),
            )
            row = await cur.fetchone()
        assert row is not None
        return cron_view(row)

    async def delete(self, cron_id: str) -> None:
        """Delete a cron; runs it started are kept."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM lg_crons WHERE cron_id = %s AND tenant_id = %s RETURNING cron_id",
                (cron_id, self.who.tenant_id),
            )
            if await cur.fetchone() is None:
                raise LangGraphItemNotFoundError(f"cron {cron_id} not found")

    async def update(self, cron_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Change a cron's schedule, `enabled`, `end_time` or run fields."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT * FROM lg_crons WHERE cron_id = %s AND tenant_id = %s FOR UPDATE",
                (cron_id, self.who.tenant_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise LangGraphItemNotFoundError(f"cron {cron_id} not found")
            schedule = str(body.get("schedule") or row["schedule"])
            zone = str(body.get("timezone") or row["timezone"])
            payload = {**row["payload"], **{k: body[k] for k in _RUN_FIELDS if k in body}}
            cur = await conn.execute(
                "UPDATE lg_crons SET schedule = %s, timezone = %s, payload = %s,"
                " enabled = %s, end_time = %s, next_run_at = %s, updated_at = now()"
                " WHERE cron_id = %s RETURNING *",
                (
                    schedule,
                    zone,
                    Jsonb(payload),
                    body.get("enabled", row["enabled"]) is not False,
                    body.get("end_time", row["end_time"]),
                    next_time(schedule, zone, datetime.now(UTC)),
                    cron_id,
                ),
            )
            updated = await cur.fetchone()
        assert updated is not None
        return cron_view(updated)

    async def search(self, body: dict[str, Any], *, count: bool = False) -> Any:
        """Return the tenant's crons by `assistant_id` and `thread_id` (or their count)."""
        where, args = "tenant_id = %s", [self.who.tenant_id]
        if body.get("assistant_id"):
            book = AssistantBook(self.pool, self.graphs, self.who)
            assistant, _ = await book.named(str(body["assistant_id"]))
            where += " AND assistant_id = %s"
            args.append(str(assistant["assistant_id"]))
        if body.get("thread_id"):
            where += " AND thread_id = %s"
            args.append(str(body["thread_id"]))
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT * FROM lg_crons WHERE {where} ORDER BY created_at DESC, cron_id", args
            )
            rows = await cur.fetchall()
        if count:
            return len(rows)
        offset, limit = int(body.get("offset") or 0), int(body.get("limit") or 10)
        return [cron_view(r) for r in rows[offset : offset + limit]]


async def claim_firing(pool: Pool) -> tuple[dict[str, Any], datetime] | None:
    """Claim one due (or stale) firing; return its cron and due time, or None."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "SELECT f.due_at, c.* FROM lg_cron_firings f JOIN lg_crons c USING (cron_id)"
            " WHERE f.run_id IS NULL AND f.claimed_at < now() - make_interval(secs => %s)"
            " ORDER BY f.claimed_at LIMIT 1 FOR UPDATE OF f SKIP LOCKED",
            (STALE_FIRING_S,),
        )
        stale = await cur.fetchone()
        if stale is not None:
            await conn.execute(
                "UPDATE lg_cron_firings SET claimed_at = now() WHERE cron_id = %s AND due_at = %s",
                (stale["cron_id"], stale["due_at"]),
            )
            return stale, stale["due_at"]
        cur = await conn.execute(
            "SELECT * FROM lg_crons WHERE enabled AND next_run_at <= now()"
            " ORDER BY next_run_at LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        cron = await cur.fetchone()
        if cron is None:
            return None
        due = cron["next_run_at"]
        later = next_time(cron["schedule"], cron["timezone"], max(due, datetime.now(UTC)))
        still = cron["end_time"] is None or later <= cron["end_time"]
        await conn.execute(
            "UPDATE lg_crons SET next_run_at = %s, enabled = %s, updated_at = now()"
            " WHERE cron_id = %s",
            (later, still, cron["cron_id"]),
        )
        await conn.execute(
            "INSERT INTO lg_cron_firings (cron_id, due_at) VALUES (%s, %s)",
            (cron["cron_id"], due),
        )
        return cron, due


async def mark_fired(pool: Pool, cron_id: str, due_at: datetime, run_id: str) -> None:
    """Record the run a firing started."""
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE lg_cron_firings SET run_id = %s WHERE cron_id = %s AND due_at = %s",
            (run_id, cron_id, due_at),
        )


async def disable_cron(pool: Pool, cron_id: str) -> None:
    """Stop a cron from firing again (its row and firings are kept, to be read or deleted)."""
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE lg_crons SET enabled = false, updated_at = now() WHERE cron_id = %s",
            (cron_id,),
        )
