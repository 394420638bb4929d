"""What the web console reads that the rest of the API does not serve in one request.

A filtered run list with counts per status, a paged JSON read of a run's event log (a run of
100,000 events is read a page at a time, not replayed over SSE), and usage broken down by
day, model, user or agent profile. Everything is scoped by the caller's tenant; callers
without the `billing` role see only their own usage, as `GET /api/usage` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from nodes.models.usage import money
from server.auth import Principal
from server.db.pool import Pool
from server.domain import IN_PROGRESS, Run, RunStatus, status_in
from server.errors import BadCursorError, BadRequestError
from server.events.log import read_events
from server.runs.records import get_run
from server.runs.views import run_view

STUCK_AFTER_S = 300
"""An unfinished run with no change for this long is shown as stuck."""

Dimension = Literal["day", "model", "user", "agent"]


@dataclass(frozen=True)
class RunFilter:
    """The run list's filters; None means any."""

    status: RunStatus | None = None
    agent: str | None = None
    user: str | None = None
    model: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    min_cost: Decimal | None = None
    flag: Literal["stuck", "dead_letter"] | None = None


_STUCK = (
    f"({status_in(IN_PROGRESS)} AND status <> 'paused'"
    f" AND updated_at < now() - interval '{STUCK_AFTER_S} seconds')"
)
_DEAD = "(error_type = 'dead_letter')"


def _where(who: Principal, f: RunFilter) -> tuple[list[str], list[Any]]:
    """Return the SQL conditions (all but status) and their parameters."""
    where: list[str] = ["tenant_id = %s"]
    params: list[Any] = [who.tenant_id]
    for column, value in (("agent_name", f.agent), ("user_id", f.user)):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    if f.model is not None:
        # The model asked for, or any model a call of the run went to (fallbacks included).
        where.append(
            "(model = %s OR EXISTS (SELECT 1 FROM model_calls mc"
            " WHERE mc.run_id = runs.id AND mc.model_id = %s))"
        )
        params += [f.model, f.model]
    if f.since is not None:
        where.append("created_at >= %s")
        params.append(f.since)
    if f.until is not None:
        where.append("created_at < %s")
        params.append(f.until)
    if f.min_cost is not None:
        where.append("COALESCE((usage->>'cost')::numeric, 0) >= %s")
        params.append(f.min_cost)
    if f.flag == "stuck":
        where.append(_STUCK)
    elif f.flag == "dead_letter":
        where.append(_DEAD)
    return where, params


async def list_runs(
    pool: Pool, who: Principal, f: RunFilter, cursor: str | None, limit: int
) -> dict[str, Any]:
    """Return a page of the tenant's runs that match `f`, newest first, and counts per status.

    The counts apply every filter but the status, so they say what each status tab holds.

    Raises:
        BadCursorError: `cursor` is not a run of this tenant.
    """
    where, params = _where(who, f)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status, count(*) AS n, count(*) FILTER (WHERE "
            + _STUCK
            + ") AS stuck, count(*) FILTER (WHERE "
            + _DEAD
            + ") AS dead FROM runs WHERE "
            + " AND ".join(where)
            + " GROUP BY status",
            params,
        )
        rows = await cur.fetchall()
        counts = {s.value: 0 for s in RunStatus}
        counts.update({r["status"]: r["n"] for r in rows})
        flags = {"stuck": sum(r["stuck"] for r in rows), "deadLetter": sum(r["dead"] for r in rows)}
        page_where, page_params = list(where), list(params)
        if f.status is not None:
            page_where.append("status = %s")
            page_params.append(f.status.value)
        if cursor:  # an empty cursor is the first page, as none is
            cur = await conn.execute(
                "SELECT created_at, id FROM runs WHERE id = %s AND tenant_id = %s",
                (cursor, who.tenant_id),
            )
            mark = await cur.fetchone()
            if mark is None:
                raise BadCursorError(cursor)
            page_where.append("(created_at, id) < (%s, %s)")
            page_params += [mark["created_at"], mark["id"]]
        cur = await conn.execute(
            f"SELECT *, {_STUCK} AS stuck, {_DEAD} AS dead FROM runs WHERE "
            + " AND ".join(page_where)
            + " ORDER BY created_at DESC, id DESC LIMIT %s",
            [*page_params, limit + 1],
        )
        page = await cur.fetchall()
    next_cursor = page[limit - 1]["id"] if len(page) > limit else None
    runs = []
    for row in page[:limit]:
        marks = [m for m, on in (("stuck", row["stuck"]), ("dead_letter", row["dead"])) if on]
        runs.append({**run_view(Run.from_row(row)), "flags": marks})
    return {"runs": runs, "nextCursor": next_cursor, "counts": counts, "flags": flags}


async def events_page(pool: Pool, who: Principal, run_id: str, after: int, limit: int) -> str:
    """Return a page of the run's events after `after` as a JSON document (already encoded).

    The stored wire JSON of each event is joined as is, so a page of thousands of events is
    not parsed and encoded again.

    Raises:
        RunNotFoundError: no such run for this tenant.
    """
    async with pool.connection() as conn:
        run = await get_run(conn, who, run_id)
        events = await read_events(conn, run_id, after, limit)
    last = events[-1][0] if events else after
    more = last < run.last_event_seq
    return (
        f'{{"runId": "{run.id}", "lastEventId": {run.last_event_seq}, "after": {after},'
        f' "nextAfter": {last if more else "null"}, "events": ['
        + ", ".join(wire for _, _, wire in events)
        + "]}"
    )


def _utc(moment: datetime) -> datetime:
    """Read a time given without a zone as UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


_KEYS: dict[Dimension, str] = {
    "day": "to_char(mc.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    "model": "mc.model_id",
    "user": "mc.user_id",
    "agent": "r.agent_name",
}


async def usage_breakdown(
    pool: Pool,
    who: Principal,
    by: Dimension,
    since: datetime | None,
    until: datetime | None,
) -> dict[str, Any]:
    """Return cost, tokens, calls and runs per day, model, user or agent profile.

    The period defaults to the 30 days up to `until` (by default, now).

    Raises:
        BadRequestError: the period is empty, longer than 366 days, or out of range.
    """
    until = _utc(until or datetime.now(UTC))
    try:
        since = _utc(since or until - timedelta(days=30))
    except OverflowError:
        raise BadRequestError(f"'until' {until.isoformat()} is too early") from None
    if until <= since:
        raise BadRequestError("'until' must be later than 'since'")
    if (until - since).days > 366:
        raise BadRequestError("the period is at most 366 days: narrow 'since' and 'until'")
    where, params = (
        ["mc.tenant_id = %s", "mc.created_at >= %s", "mc.created_at < %s"],
        [
            who.tenant_id,
            since,
            until,
        ],
    )
    if not who.has_role("billing"):
        where.append("mc.user_id = %s")
        params.append(who.user_id)
    key = _KEYS[by]
    async with pool.connection() as conn:
        cur = await conn.execute(
            f"SELECT {key} AS key, count(*) AS calls, count(DISTINCT mc.run_id) AS runs,"
            " COALESCE(sum(mc.input_tokens), 0) AS input_tokens,"
            " COALESCE(sum(mc.output_tokens), 0) AS output_tokens,"
            " COALESCE(sum(mc.total_tokens), 0) AS total_tokens,"
            " COALESCE(sum(mc.cost), 0) AS cost, count(*) FILTER (WHERE mc.cost IS NULL)"
            " AS unpriced FROM model_calls mc JOIN runs r ON r.id = mc.run_id"
            f" WHERE {' AND '.join(where)} GROUP BY 1 ORDER BY 1",
            params,
        )
        rows = await cur.fetchall()
    return {
        "by": by,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "scope": "tenant" if who.has_role("billing") else "user",
        "groups": [
            {
                "key": r["key"],
                "runs": r["runs"],
                "modelCalls": r["calls"],
                "inputTokens": r["input_tokens"],
                "outputTokens": r["output_tokens"],
                "totalTokens": r["total_tokens"],
                "cost": money(Decimal(r["cost"])),
                "unpricedCalls": r["unpriced"],
            }
            for r in rows
        ],
    }
