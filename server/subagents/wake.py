"""Tell a waiting parent that its children ended, and queue it again after the last one.

Called right after a child run ends (by its worker, or by the API that cancelled it), and by
every worker's poll as a sweep, so a parent whose child ended while its reporter crashed is
still woken. Reporting is idempotent: under the parent's row lock, only children the parent's
snapshot still awaits are reported, each once.
"""

from __future__ import annotations

import logging

from graphs.events import EventType
from server.db.pool import Pool, retry_deadlocks
from server.domain import TERMINAL, Run, RunStatus, status_in
from server.events.log import NewEvent, append_events, load_head
from server.runs.records import cancel_children
from server.subagents.results import completed_event, delegation_rows, ended

log = logging.getLogger(__name__)

# A parent waiting for its children holds no worker, so its stored snapshot is up to date.
_WAITING_PARENTS = f"""
SELECT p.id FROM runs p JOIN run_snapshots s ON s.run_id = p.id
WHERE p.status = '{RunStatus.WAITING_TOOL.value}' AND p.lease_owner IS NULL
  AND EXISTS (
    SELECT 1 FROM jsonb_array_elements(
        COALESCE(COALESCE(s.snapshot, s.snapshot_text::jsonb) -> 'children', '[]')) c
    LEFT JOIN runs r ON r.id = c ->> 'runId'
    WHERE c ->> 'status' = 'running' AND (r.id IS NULL OR {status_in(TERMINAL, "r.status")}))
ORDER BY p.updated_at LIMIT %s
"""


async def report_to_parent(pool: Pool, parent_id: str) -> int:
    """Store `subagent.completed` for each awaited child of the parent that ended.

    The fold moves the parent to queued when no child is awaited any more (and NOTIFYs the
    workers). Return how many children were reported.
    """

    async def attempt() -> int:
        async with pool.connection() as conn, conn.transaction():
            head = await load_head(conn, parent_id, lock=True)
            cur = await conn.execute("SELECT lease_owner FROM runs WHERE id = %s", (parent_id,))
            row = await cur.fetchone()
            if head.status != RunStatus.WAITING_TOOL or row is None or row["lease_owner"]:
                return 0
            awaited = [c for c in head.snapshot.get("children", []) if c["status"] == "running"]
            if not awaited:
                return 0
            rows = await delegation_rows(conn, parent_id)
            events = [
                NewEvent(EventType.SUBAGENT_COMPLETED, completed_event(rows[c["toolCallId"]]))
                for c in awaited
                if c["toolCallId"] in rows and ended(rows[c["toolCallId"]])
            ]
            if events:
                await append_events(conn, parent_id, events, head=head)
            return len(events)

    return await retry_deadlocks(attempt)


async def wake_parents(pool: Pool, limit: int = 100) -> int:
    """Report ended children to every waiting parent that has some (the sweep)."""
    async with pool.connection() as conn:
        cur = await conn.execute(_WAITING_PARENTS, (limit,))
        parents = [r["id"] for r in await cur.fetchall()]
    count = 0
    for parent_id in parents:
        count += await report_to_parent(pool, parent_id)
    return count


async def after_run_end(pool: Pool, run: Run, status: str) -> None:
    """Tell the run's parent it ended, and cancel what is left of its own children."""
    try:
        if run.parent_run_id is not None:
            await report_to_parent(pool, run.parent_run_id)
        if status in (RunStatus.FAILED, RunStatus.CANCELLED):
            await cancel_children(pool, run.id, "system")
    except Exception:
        # The sweep of every worker's poll reports it later; nothing is lost.
        log.exception("run %s: reporting its end to its parent failed", run.id)
