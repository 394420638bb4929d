"""What the API asks of subagents: a run's children, retrying a child, a tree's usage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphs.events import EventType
from server.auth import Principal
from server.db.pool import Conn, Pool, retry_deadlocks
from server.domain import Run, RunStatus
from server.errors import RunNotRetryableError
from server.events.log import NewEvent, RunHead, append_events, load_head
from server.runs.records import NewChildRun, get_run, insert_child_run
from server.subagents.usage import usage_with_descendants
from server.timestamps import iso

_CHILDREN = """
SELECT r.*, c.metadata ->> 'toolCallId' AS tool_call_id, s.task, s.spec,
       (s.child_run_id IS NOT NULL) AS current
FROM runs r
JOIN conversations c ON c.id = r.conversation_id
LEFT JOIN subagent_calls s ON s.child_run_id = r.id
WHERE r.parent_run_id = %s
ORDER BY r.created_at, r.id
"""


def child_view(row: dict[str, Any]) -> dict[str, Any]:
    """Render one child run for `GET /api/runs/{id}/children`."""
    run = Run.from_row(row)
    return {
        "runId": run.id,
        "toolCallId": row["tool_call_id"],
        "agent": {"name": run.agent_name, "version": run.agent_version},
        "status": run.status.value,
        "task": row["task"],
        "current": bool(row["current"]),
        "depth": run.depth,
        "model": run.model,
        "usage": run.usage,
        "error": {"type": run.error_type, "message": run.error_message} if run.error_type else None,
        "createdAt": iso(run.created_at),
        "finishedAt": iso(run.finished_at),
    }


async def live_children(conn: Conn, snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the snapshot's children with each child run's status as of now."""
    children = [dict(c) for c in snapshot.get("children", [])]
    ids = [c["runId"] for c in children if c.get("runId")]
    if not ids:
        return children
    cur = await conn.execute("SELECT id, status FROM runs WHERE id = ANY(%s)", (ids,))
    status = {r["id"]: r["status"] for r in await cur.fetchall()}
    for child in children:
        child["status"] = status.get(child.get("runId") or "", child["status"])
    return children


@dataclass(frozen=True)
class SubagentService:
    """The subagent side of the API, bound to one process's pool."""

    pool: Pool

    async def children(self, who: Principal, run_id: str) -> list[dict[str, Any]]:
        """List the run's child runs, oldest first (retried ones too, `current: false`).

        Raises:
            RunNotFoundError: no such run for the caller's tenant.
        """
        async with self.pool.connection() as conn:
            await get_run(conn, who, run_id)
            cur = await conn.execute(_CHILDREN, (run_id,))
            return [child_view(r) for r in await cur.fetchall()]

    async def snapshot(self, who: Principal, run_id: str) -> tuple[RunHead, list[dict[str, Any]]]:
        """Return the run's head (its snapshot up to date) and its children's live status.

        Raises:
            RunNotFoundError: no such run for the caller's tenant.
        """
        async with self.pool.connection() as conn:
            await get_run(conn, who, run_id)
            head = await load_head(conn, run_id, lock=False)
            return head, await live_children(conn, head.snapshot)

    async def usage(self, who: Principal, run_id: str) -> dict[str, Any]:
        """Return the totals of the run and every run below it.

        Raises:
            RunNotFoundError: no such run for the caller's tenant.
        """
        async with self.pool.connection() as conn:
            await get_run(conn, who, run_id)
            return await usage_with_descendants(conn, run_id)

    async def retry(self, who: Principal, run_id: str) -> Run:
        """Start a finished child run again as a new child; its parent waits for that one.

        Raises:
            RunNotFoundError: no such run for the caller's tenant.
            RunNotRetryableError: not a child, not finished, replaced by a retry already, or
                its parent no longer waits for it.
        """

        async def attempt() -> Run:
            async with self.pool.connection() as conn, conn.transaction():
                return await _retry(conn, who, run_id)

        return await retry_deadlocks(attempt)


async def _retry(conn: Conn, who: Principal, run_id: str) -> Run:
    old = await get_run(conn, who, run_id)
    if old.parent_run_id is None:
        raise RunNotRetryableError(
            run_id, "only a subagent's run can be retried; post the message again instead"
        )
    # The parent's row first, then the child's: the order cancelling a parent takes.
    head = await load_head(conn, old.parent_run_id, lock=True)
    old = await get_run(conn, who, run_id, lock=True)
    if not old.is_terminal:
        raise RunNotRetryableError(run_id, f"it is still {old.status.value}; cancel it first")
    cur = await conn.execute(
        "SELECT * FROM subagent_calls WHERE child_run_id = %s FOR UPDATE", (run_id,)
    )
    delegation = await cur.fetchone()
    if delegation is None:
        raise RunNotRetryableError(run_id, "a newer retry of it replaced it")
    parent = await get_run(conn, who, head.run_id)
    if parent.status != RunStatus.WAITING_TOOL or parent.lease_owner is not None:
        raise RunNotRetryableError(
            run_id,
            f"its parent run {parent.id} is {parent.status.value} and no longer waits for it",
        )
    cur = await conn.execute("SELECT content FROM messages WHERE id = %s", (old.input_message_id,))
    task = await cur.fetchone()
    assert task is not None
    child = NewChildRun(
        parent,
        task["content"],
        old.model,
        old.options,
        old.agent,
        delegation["tool_call_id"],
    )
    new = await insert_child_run(conn, child)
    await conn.execute(
        "UPDATE subagent_calls SET child_run_id = %s, children = children + 1,"
        " updated_at = now() WHERE parent_run_id = %s AND tool_call_id = %s",
        (new.id, parent.id, delegation["tool_call_id"]),
    )
    started = NewEvent(
        EventType.SUBAGENT_STARTED,
        {
            "toolCallId": delegation["tool_call_id"],
            "childRunId": new.id,
            "agent": delegation["agent"],
            "task": delegation["task"],
        },
    )
    await append_events(conn, parent.id, [started], head=head)
    return new
