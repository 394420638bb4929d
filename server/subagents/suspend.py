"""Where a run's graph interrupts go: approvals to reviewers, delegations to child runs.

`suspend_run` stores what a stopped run waits for; `resume_value` builds the resume of a
re-queued run once everything it waited for is there (None while something is missing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.types import Command, Interrupt

from graphs.subagent import ChildResult, SubagentResume, is_subagent_request, request_delegations
from server.db.pool import Pool
from server.domain import Run
from server.events.writer import EventWriter
from server.runs.approvals import resume_command, suspend
from server.settings import Settings
from server.subagents.results import child_result, delegation_rows, ended
from server.subagents.spawn import start_children


async def suspend_run(
    pool: Pool,
    settings: Settings,
    writer: EventWriter,
    run: Run,
    interrupts: Sequence[Interrupt],
) -> None:
    """Store the approvals and start the children the run's interrupts ask for."""
    approvals = [i for i in interrupts if not is_subagent_request(i.value)]
    delegations = [d for i in interrupts for d in request_delegations(i.value)]
    if approvals:
        await suspend(pool, writer, run, approvals)
    if delegations:
        await start_children(pool, settings, writer, run, delegations)


async def _subagent_resume(
    pool: Pool, run_id: str, interrupts: Sequence[Interrupt]
) -> dict[str, SubagentResume] | None:
    async with pool.connection() as conn:
        rows = await delegation_rows(conn, run_id)
    resume: dict[str, SubagentResume] = {}
    for intr in interrupts:
        results: dict[str, ChildResult] = {}
        for delegation in request_delegations(intr.value):
            row = rows.get(delegation["toolCallId"])
            if row is None or not ended(row):
                return None
            results[delegation["toolCallId"]] = child_result(row)
        resume[intr.id] = {"results": results}
    return resume


async def resume_value(
    pool: Pool, run_id: str, interrupts: Sequence[Interrupt]
) -> Command[Any] | None:
    """Return `Command(resume=...)` once every interrupt has its answer, else None."""
    approvals = [i for i in interrupts if not is_subagent_request(i.value)]
    delegating = [i for i in interrupts if is_subagent_request(i.value)]
    resume: dict[str, Any] = {}
    if approvals:
        decided = await resume_command(pool, run_id, approvals)
        if decided is None:
            return None
        resume.update(dict(decided.resume or {}))
    if delegating:
        answered = await _subagent_resume(pool, run_id, delegating)
        if answered is None:
            return None
        resume.update(answered)
    return Command(resume=resume)
