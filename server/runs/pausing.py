"""Operator pause and resume of a run (docs/decisions/1090).

A run no worker holds (queued, waiting for approval) is paused here and now with `run.paused`.
A running one gets `pause_requested` and a NOTIFY on `agentrt_pause`; its worker drains it at
the next step boundary, after the last step's checkpoint, and stores `run.paused` itself,
which releases the lease and the worker's slot. `run.resumed` puts the run back in the queue,
or back to waiting for a reviewer while approvals are pending, and pushes its wall-clock
deadline back by the time it spent paused.
"""

from __future__ import annotations

from typing import Any

from graphs.events import EventType
from server.auth import Principal
from server.db.pool import Pool
from server.domain import RunStatus, can_pause, is_terminal
from server.events.channels import PAUSE_CHANNEL
from server.events.log import Conn, NewEvent, RunFinishedError, RunHead, append_events
from server.runs.records import get_run


class RunForbiddenError(PermissionError):
    """The caller may not control this run (it is neither its owner nor a tenant admin)."""


class RunNotPausedError(RuntimeError):
    """Resume was asked of a run that is not paused."""

    def __init__(self, run_id: str, status: str, pause_requested: bool) -> None:
        if pause_requested:
            message = (
                f"run {run_id} is still {status}: its pause takes effect at its next step, "
                "so resume it once its status is paused"
            )
        else:
            message = f"run {run_id} is {status}, not paused: only a paused run can be resumed"
        super().__init__(message)
        self.status = status


async def mark_paused(conn: Conn, head: RunHead) -> None:
    """Record when the run was paused; pass as `extra` with the `run.paused` event."""
    await conn.execute(
        "UPDATE runs SET pause_requested = false, paused_at = now() WHERE id = %s",
        (head.run_id,),
    )


async def _lock_run(conn: Conn, who: Principal, run_id: str) -> dict[str, Any]:
    row = await get_run(conn, who, run_id, lock=True)
    if row["user_id"] != who.user_id and not who.has_role("admin"):
        raise RunForbiddenError(
            f"run {run_id} belongs to another user: only its owner or a tenant admin can "
            "pause or resume it"
        )
    return row


async def request_pause(pool: Pool, who: Principal, run_id: str) -> dict[str, Any]:
    """Pause a run: at once when no worker holds it, else at its worker's next step boundary.

    Pausing a paused run, or one whose pause is pending, changes nothing.

    Raises:
        RunNotFoundError: no such run for this tenant (404).
        RunForbiddenError: the caller is neither the run's owner nor a tenant admin (403).
        RunFinishedError: the run already ended (409).
    """
    async with pool.connection() as conn:
        async with conn.transaction():
            row = await _lock_run(conn, who, run_id)
            status = RunStatus(row["status"])
            if is_terminal(status):
                raise RunFinishedError(run_id, status)
            if status in (RunStatus.QUEUED, RunStatus.WAITING_USER):
                event = NewEvent(
                    EventType.RUN_PAUSED,
                    {"reason": "pause requested", "by": who.user_id, "from": status.value},
                )
                await append_events(conn, run_id, [event], extra=mark_paused)
            elif can_pause(status) and not row["pause_requested"]:
                await conn.execute(
                    "UPDATE runs SET pause_requested = true, updated_at = now() WHERE id = %s",
                    (run_id,),
                )
                await conn.execute("SELECT pg_notify(%s, %s)", (PAUSE_CHANNEL, run_id))
        return await get_run(conn, who, run_id)


async def request_resume(pool: Pool, who: Principal, run_id: str) -> dict[str, Any]:
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
            row = await _lock_run(conn, who, run_id)
            status = RunStatus(row["status"])
            if is_terminal(status):
                raise RunFinishedError(run_id, status)
            if status != RunStatus.PAUSED:
                raise RunNotPausedError(run_id, status, row["pause_requested"])
            await conn.execute(
                "UPDATE runs SET deadline_at = deadline_at + (now() - paused_at),"
                " paused_at = NULL WHERE id = %s",
                (run_id,),
            )
            await append_events(
                conn, run_id, [NewEvent(EventType.RUN_RESUMED, {"by": who.user_id})]
            )
        return await get_run(conn, who, run_id)
