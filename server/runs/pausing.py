"""Operator pause and resume of a run (docs/decisions/1090).

A run no worker holds (queued, waiting for approval) is paused here and now with `run.paused`.
A running one gets `pause_requested` and a NOTIFY on `agentrt_pause`; its worker drains it at
the next step boundary, after the last step's checkpoint, and stores `run.paused` itself,
which releases the lease and the worker's slot. `run.resumed` puts the run back in the queue,
or back to waiting for a reviewer while approvals are pending, and pushes its wall-clock
deadline back by the time it spent paused.
"""

from __future__ import annotations

from graphs.events import EventType
from server.auth import Principal
from server.db.pool import Conn, Pool
from server.domain import Run, RunStatus, can_pause
from server.errors import RunFinishedError, RunForbiddenError, RunNotPausedError
from server.events.log import NewEvent, append_events
from server.lifecycle import audit
from server.runs.records import get_run, mark_paused, request_pause_flag, unpause


async def _lock_run(conn: Conn, who: Principal, run_id: str) -> Run:
    run = await get_run(conn, who, run_id, lock=True)
    if run.user_id != who.user_id and not who.has_role("admin"):
        raise RunForbiddenError(
            f"run {run_id} belongs to another user: only its owner or a tenant admin can "
            "pause or resume it"
        )
    if run.is_terminal:
        raise RunFinishedError(run_id, run.status)
    return run


async def request_pause(pool: Pool, who: Principal, run_id: str) -> Run:
    """Pause a run: at once when no worker holds it, else at its worker's next step boundary.

    Pausing a paused run, or one whose pause is pending, changes nothing.

    Raises:
        RunNotFoundError: no such run for this tenant (404).
        RunForbiddenError: the caller is neither the run's owner nor a tenant admin (403).
        RunFinishedError: the run already ended (409).
    """
    async with pool.connection() as conn:
        async with conn.transaction():
            run = await _lock_run(conn, who, run_id)
            if run.status in (RunStatus.QUEUED, RunStatus.WAITING_USER):
                event = NewEvent(
                    EventType.RUN_PAUSED,
                    {"reason": "pause requested", "by": who.user_id, "from": run.status.value},
                )
                await append_events(conn, run_id, [event], extra=mark_paused)
            elif can_pause(run.status) and not run.pause_requested:
                await request_pause_flag(conn, run_id)
            else:
                return await get_run(conn, who, run_id)
            await audit.record(
                conn,
                tenant_id=who.tenant_id,
                actor=who.user_id,
                action="run.pause_requested",
                target=run_id,
                diff={"status": run.status.value},
            )
        return await get_run(conn, who, run_id)


async def request_resume(pool: Pool, who: Principal, run_id: str) -> Run:
    """Resume a paused run from its last checkpoint.

    It goes back to the queue, or to waiting_user while any of its approvals is pending, and
    its deadline moves back by the time it was paused.

    Raises:
        RunNotFoundError: no such run for this tenant (404).
        RunForbiddenError: the caller is neither the run's owner nor a tenant admin (403).
        RunFinishedError: the run already ended (409).
        RunNotPausedError: the run is not paused, or its pause has not taken effect yet (409).
    """
    async with pool.connection() as conn:
        async with conn.transaction():
            run = await _lock_run(conn, who, run_id)
            if run.status != RunStatus.PAUSED:
                raise RunNotPausedError(run_id, run.status, run.pause_requested)
            await unpause(conn, run_id)
            await append_events(
                conn, run_id, [NewEvent(EventType.RUN_RESUMED, {"by": who.user_id})]
            )
            await audit.record(
                conn,
                tenant_id=who.tenant_id,
                actor=who.user_id,
                action="run.resumed",
                target=run_id,
            )
        return await get_run(conn, who, run_id)
