"""Erasure of a conversation, or of everything of a user in a tenant: resumable, idempotent.

An erasure is a row in `erasures` and a list of steps (server/lifecycle/erasers.py). Each step
deletes one table's rows and records itself as done in the same transaction, so a crash
leaves the erasure `running` and the next request (or the housekeeping job) resumes it at the
first step not done. Only the finished erasure leaves its audit row: counts, never content.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from server.auth import Principal
from server.db.pool import Conn, Pool
from server.domain import IN_PROGRESS, status_in
from server.errors import (
    ConversationNotFoundError,
    ForbiddenError,
    RunFinishedError,
    RunsActiveError,
)
from server.ids import new_id
from server.lifecycle import audit
from server.lifecycle.erasers import CONVERSATION_ERASERS, USER_ERASERS, Eraser, Params
from server.observability.tracing import hex_trace_id
from server.runs.records import request_cancel

log = logging.getLogger(__name__)

StepHook = Callable[[str], Awaitable[None]]
"""Called after each committed step with its name (tests inject a crash here)."""


@dataclass(frozen=True)
class Erasure:
    """An erasure's outcome: which, and how many rows each step removed."""

    id: str
    scope: str
    subject: str
    status: str
    counts: dict[str, int]

    def view(self) -> dict[str, Any]:
        """The API's view."""
        return {
            "erasureId": self.id,
            "scope": self.scope,
            "subject": self.subject,
            "status": self.status,
            "counts": self.counts,
        }


async def _active_runs(pool: Pool, tenant: str, column: str, value: str) -> list[str]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            f"SELECT id FROM runs WHERE tenant_id = %s AND {column} = %s"
            f" AND {status_in(IN_PROGRESS)} ORDER BY created_at",
            (tenant, value),
        )
        return [r["id"] for r in await cur.fetchall()]


async def _settle_runs(
    pool: Pool, who: Principal, what: str, column: str, value: str, *, cancel: bool, wait_s: float
) -> None:
    """Refuse while runs are in progress; with `cancel`, cancel them and wait for their end."""
    active = await _active_runs(pool, who.tenant_id, column, value)
    if not active:
        return
    if not cancel:
        raise RunsActiveError(what, active, cancelling=False)
    for run_id in active:
        try:
            await request_cancel(pool, who, run_id)
        except RunFinishedError:
            continue
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while active and loop.time() < deadline:
        await asyncio.sleep(0.2)  # a worker stops at its next safe point: poll its record
        active = await _active_runs(pool, who.tenant_id, column, value)
    if active:
        raise RunsActiveError(what, active, cancelling=True)


async def _open(pool: Pool, who: Principal, scope: str, subject: str) -> dict[str, Any]:
    """Return the running erasure of this subject (a crashed one), or start one."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO erasures (id, tenant_id, scope, subject, requested_by)"
            " VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, scope, subject) WHERE status = 'running' DO NOTHING",
            (new_id("era"), who.tenant_id, scope, subject, who.user_id),
        )
        cur = await conn.execute(
            "SELECT * FROM erasures WHERE tenant_id = %s AND scope = %s AND subject = %s"
            " AND status = 'running' FOR UPDATE",
            (who.tenant_id, scope, subject),
        )
        row = await cur.fetchone()
        assert row is not None  # inserted above, or running already
        return row


async def _table_exists(conn: Conn, table: str) -> bool:
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL AS ok", (table,))
    row = await cur.fetchone()
    return bool(row and row["ok"])


async def _step(pool: Pool, erasure_id: str, key: str, eraser: Eraser, params: Params) -> None:
    """Run one step and record it done, atomically; a step already done is skipped."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "SELECT done FROM erasures WHERE id = %s FOR UPDATE", (erasure_id,)
        )
        row = await cur.fetchone()
        if row is None or key in row["done"]:
            return
        count = 0
        if await _table_exists(conn, eraser.table):
            if eraser.custom is not None:
                count = await eraser.custom(conn, params)
            else:
                assert eraser.sql is not None
                count = (await conn.execute(eraser.sql, params)).rowcount
        await conn.execute(
            "UPDATE erasures SET done = array_append(done, %(key)s),"
            " counts = jsonb_set(counts, ARRAY[%(name)s],"
            " to_jsonb(COALESCE((counts->>%(name)s)::bigint, 0) + %(n)s))"
            " WHERE id = %(id)s",
            {"key": key, "name": eraser.name, "n": max(count, 0), "id": erasure_id},
        )


async def _conversation_params(pool: Pool, tenant: str, conversation: str) -> Params:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM runs WHERE conversation_id = %s AND tenant_id = %s",
            (conversation, tenant),
        )
        runs = [r["id"] for r in await cur.fetchall()]
    return {
        "tenant": tenant,
        "conversation": conversation,
        "runs": runs,
        "traces": [hex_trace_id(r) for r in runs],
    }


async def _child_conversations(pool: Pool, tenant: str, conversation: str) -> list[str]:
    """The conversations of the subagent runs this conversation's runs started."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT DISTINCT c.conversation_id FROM runs c JOIN runs p ON c.parent_run_id = p.id"
            " WHERE p.conversation_id = %s AND p.tenant_id = %s AND c.tenant_id = %s",
            (conversation, tenant, tenant),
        )
        return [r["conversation_id"] for r in await cur.fetchall()]


async def _erase_conversation_steps(
    pool: Pool, erasure_id: str, tenant: str, conversation: str, hook: StepHook | None
) -> None:
    # Subagents' conversations first: deleting the parent runs would cut the link to them.
    for child in await _child_conversations(pool, tenant, conversation):
        await _erase_conversation_steps(pool, erasure_id, tenant, child, hook)
    for eraser in CONVERSATION_ERASERS:
        # Run ids are read before each step: once `runs` is done they are gone, and so is the
        # need for them (every step that uses them comes before).
        params = await _conversation_params(pool, tenant, conversation)
        await _step(pool, erasure_id, f"{conversation}/{eraser.name}", eraser, params)
        if hook is not None:
            await hook(eraser.name)


async def _finish(
    pool: Pool, who: Principal, erasure_id: str, scope: str, subject: str, extra: dict[str, Any]
) -> Erasure:
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "UPDATE erasures SET status = 'done', finished_at = now(), done = '{}'"
            " WHERE id = %s AND status = 'running' RETURNING counts",
            (erasure_id,),
        )
        row = await cur.fetchone()
        counts = {k: int(v) for k, v in (row["counts"] if row else {}).items()}
        if row is not None:
            await audit.record(
                conn,
                tenant_id=who.tenant_id,
                actor=who.user_id,
                action="data.erased",
                target=f"{scope}:{subject}",
                diff={"erasureId": erasure_id, "counts": counts, **extra},
            )
    return Erasure(erasure_id, scope, subject, "done", counts)


async def _last_done(pool: Pool, tenant: str, scope: str, subject: str) -> Erasure | None:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM erasures WHERE tenant_id = %s AND scope = %s AND subject = %s"
            " AND status = 'done' ORDER BY finished_at DESC LIMIT 1",
            (tenant, scope, subject),
        )
        row = await cur.fetchone()
    if row is None:
        return None
    counts = {k: int(v) for k, v in row["counts"].items()}
    return Erasure(row["id"], row["scope"], row["subject"], row["status"], counts)


async def erase_conversation(
    pool: Pool,
    who: Principal,
    conversation_id: str,
    *,
    cancel: bool = False,
    wait_s: float = 15.0,
    hook: StepHook | None = None,
) -> Erasure:
    """Erase a conversation and everything of it (its owner or a tenant admin).

    Erasing it again answers with the finished erasure; an interrupted one resumes.

    Raises:
        ConversationNotFoundError: no such conversation in the tenant, nor an erasure of it.
        ForbiddenError: the caller neither owns it nor is a tenant admin.
        RunsActiveError: runs of it are in progress (and `cancel` did not end them in time).
    """
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT user_id FROM conversations WHERE id = %s AND tenant_id = %s",
            (conversation_id, who.tenant_id),
        )
        conv = await cur.fetchone()
    if conv is None:
        async with pool.connection() as conn:
            running = await conn.execute(
                "SELECT 1 FROM erasures WHERE tenant_id = %s AND scope = 'conversation'"
                " AND subject = %s AND status = 'running'",
                (who.tenant_id, conversation_id),
            )
            resumable = await running.fetchone() is not None
        if not resumable:
            done = await _last_done(pool, who.tenant_id, "conversation", conversation_id)
            if done is None:
                raise ConversationNotFoundError(conversation_id)
            return done
    elif conv["user_id"] != who.user_id and not who.has_role("admin"):
        raise ForbiddenError("only the conversation's owner or a tenant admin may erase it")
    what = f"conversation {conversation_id}"
    await _settle_runs(
        pool, who, what, "conversation_id", conversation_id, cancel=cancel, wait_s=wait_s
    )
    row = await _open(pool, who, "conversation", conversation_id)
    await _erase_conversation_steps(pool, row["id"], who.tenant_id, conversation_id, hook)
    erased = await _finish(pool, who, row["id"], "conversation", conversation_id, {})
    log.info("erased conversation %s: %s", conversation_id, erased.counts)
    return erased


async def erase_user(
    pool: Pool,
    who: Principal,
    user_id: str,
    *,
    cancel: bool = False,
    wait_s: float = 15.0,
    hook: StepHook | None = None,
) -> Erasure:
    """Erase everything of `user_id` in the caller's tenant and revoke their keys (admins).

    Idempotent: erasing again finds nothing more to delete and answers with zero counts.

    Raises:
        ForbiddenError: the caller is not the tenant's admin.
        RunsActiveError: runs of the user are in progress (and `cancel` did not end them).
    """
    if not who.has_role("admin"):
        raise ForbiddenError("erasing a user's data needs the tenant's admin role")
    await _settle_runs(
        pool, who, f"user {user_id}", "user_id", user_id, cancel=cancel, wait_s=wait_s
    )
    row = await _open(pool, who, "user", user_id)
    while True:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id FROM conversations WHERE tenant_id = %s AND user_id = %s"
                " ORDER BY created_at, id LIMIT 100",
                (who.tenant_id, user_id),
            )
            conversations = [r["id"] for r in await cur.fetchall()]
        if not conversations:
            break
        for conversation in conversations:
            await _erase_conversation_steps(pool, row["id"], who.tenant_id, conversation, hook)
    params: Params = {
        "tenant": who.tenant_id,
        "user": user_id,
        "prefix": f"{who.tenant_id}.users.{user_id}",
    }
    for eraser in USER_ERASERS:
        await _step(pool, row["id"], f"user/{eraser.name}", eraser, params)
        if hook is not None:
            await hook(eraser.name)
    erased = await _finish(pool, who, row["id"], "user", user_id, {})
    log.info("erased the data of user %s in tenant %s: %s", user_id, who.tenant_id, erased.counts)
    return erased


async def resume_erasures(pool: Pool) -> int:
    """Finish erasures a crash left running (the housekeeping job calls this); return how many."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant_id, scope, subject, requested_by FROM erasures"
            " WHERE status = 'running' AND created_at < now() - interval '1 minute'"
            " ORDER BY created_at LIMIT 20"
        )
        rows = await cur.fetchall()
    finished = 0
    for row in rows:
        who = Principal(row["tenant_id"], row["requested_by"], frozenset({"admin"}))
        erase = erase_user if row["scope"] == "user" else erase_conversation
        try:
            await erase(pool, who, row["subject"], cancel=True, wait_s=0)
        except RunsActiveError:
            continue  # cancelled now; the next pass finishes it once the runs have stopped
        finished += 1
    return finished
