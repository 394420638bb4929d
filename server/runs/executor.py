"""Execute one claimed run: run its attempt, then store how the attempt ended.

Whatever happens, the run leaves `execute_run` terminal, back in the queue, waiting, or (when
the lease or the database is lost) untouched for the reaper to recover.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from graphs.events import EventType
from server import jsontext
from server.db.checkpoint import LastCheckpoint
from server.db.pool import Conn
from server.domain import Run
from server.errors import LeaseLostError, RunFinishedError
from server.events import answers
from server.events.log import RunHead
from server.events.projection import StreamProjector
from server.events.snapshot import output_text, streaming_items
from server.events.writer import EventWriter, in_order
from server.ids import new_id
from server.langgraph_api.attempt import GraphAttempt
from server.memory.jobs import enqueue_extraction
from server.observability.callbacks import TraceCallbackHandler
from server.observability.logs import run_context
from server.observability.tracing import RunInfo, run_trace_id
from server.runs.attempt import Attempt, ExecutorDeps, Outcome, RunHandle
from server.runs.records import Claim, mark_paused
from server.runs.toolbox import held_outcomes
from server.skills.usage import SKILL_LOADS
from server.subagents.suspend import suspend_run
from server.subagents.wake import after_run_end
from server.usage.ledger import MODEL_CALLS
from tools.ledger import HeldOutcomes

log = logging.getLogger(__name__)


async def execute_run(deps: ExecutorDeps, claim: Claim, handle: RunHandle | None = None) -> None:
    """Run the graph for a claimed run until it ends, drains, is cancelled, or loses its lease.

    `claim.head` is the run's head right after the claim stored `run.started`. The attempt is
    one span of the run's trace; spans are stored with the run's final event.
    """
    run, head = claim.run, claim.head
    handle = handle or RunHandle()
    # No earlier attempt left ledger rows: calls that are safe to run again are written with
    # their outcome's event, not claimed first (docs/decisions/2026).
    held = HeldOutcomes(run.tenant_id) if run.attempt == 1 else None
    writer = EventWriter(
        deps.pool,
        head,
        on_stored=deps.metrics.events_written.inc,
        hooks=[MODEL_CALLS, SKILL_LOADS, *([held_outcomes(held)] if held else [])],
        linger_s=deps.settings.event_linger_s,
        pace_s=deps.settings.event_pace_s,
    )

    def emit(kind: EventType, data: Mapping[str, Any] | None = None) -> None:
        deps.metrics.observe_event(kind, data or {})
        writer.emit(kind, data)

    projector = StreamProjector(emit, {i["itemId"]: i["status"] for i in head.snapshot["items"]})
    for item in streaming_items(head.snapshot):
        # An earlier attempt died mid-answer; its partial text is replaced by this attempt's.
        writer.emit(
            EventType.MESSAGE_ITEM_COMPLETED,
            {
                "itemId": item["itemId"],
                "status": "superseded",
                "text": item["text"],
                "reason": "attempt abandoned",
            },
        )
    recorded = {i["itemId"] for i in head.snapshot["items"] if i["status"] == "completed"}
    kind = GraphAttempt if "langgraph" in run.options else Attempt
    attempt = kind(deps, claim, handle, projector, emit, recorded, writer, held)
    writer.lead = attempt.last.lead  # a step's events never stored ahead of its checkpoint
    info = RunInfo(run.id, run.conversation_id, run.tenant_id, head.attempt)
    token = run_context.set({"run_id": run.id, "tenant_id": run.tenant_id})
    try:
        with deps.tracing.attempt(info) as span:
            handler = TraceCallbackHandler(deps.tracing, info, span)
            outcome = await attempt.execute([handler])
            handler.close_all(f"attempt ended: {outcome.kind}")
            if outcome.kind == "failed":
                span.set_error(outcome.data["message"])
            span.set_attribute("agentrt.outcome", outcome.kind)
        if await _conclude_shielded(
            deps, writer, run, outcome, attempt.last, pause=handle.pause_requested
        ):
            outcome.cancelled = True
        if outcome.kind in ("completed", "failed", "cancelled"):
            await asyncio.shield(after_run_end(deps.pool, run, outcome.kind))
    finally:
        attempt.last.discard()  # left held only when the attempt raised: it is not stored
        run_context.reset(token)
    if outcome.cancelled:
        raise asyncio.CancelledError


async def _conclude_shielded(
    deps: ExecutorDeps,
    writer: EventWriter,
    run: Run,
    outcome: Outcome,
    last: LastCheckpoint,
    *,
    pause: bool = False,
) -> bool:
    """Store the attempt's outcome even if the task is cancelled meanwhile.

    A cancel that arrives while the outcome is being stored waits for it, so the run ends
    with that outcome (a completion that won stays completed) instead of being left for its
    lease to expire. Return whether a cancel arrived, so the caller can re-raise it.
    """
    conclusion = asyncio.ensure_future(_conclude(deps, writer, run, outcome, last, pause=pause))
    cancelled = False
    while not conclusion.done():
        try:
            await asyncio.shield(conclusion)
        except asyncio.CancelledError:
            cancelled = True
    conclusion.result()
    return cancelled


async def _conclude(
    deps: ExecutorDeps,
    writer: EventWriter,
    run: Run,
    outcome: Outcome,
    last: LastCheckpoint,
    *,
    pause: bool = False,
) -> None:
    """Store how the attempt ended.

    The graph's last checkpoint, when the saver held it (`last`), goes first in the
    transaction of the run's final event; with no final event, by itself, or not at all when
    the lease was lost.
    """
    run_id = run.id
    await last.settle()  # an append still storing what was held ends first
    if outcome.kind == "abandoned":
        last.discard()
    elif outcome.kind == "suspended":
        try:
            await last.store()
        except LeaseLostError as exc:
            log.info("run %s: its last checkpoint not stored: %s", run_id, exc)
    checkpoint = last.take()
    if outcome.kind in ("completed", "failed", "cancelled"):
        deps.tracing.end_run(run, outcome.kind, outcome.data.get("message"))
        elapsed = (datetime.now(UTC) - run.created_at).total_seconds()
        deps.metrics.observe_run_end(run.tenant_id, outcome.kind, elapsed)
        # The run's spans (and what a failed write gave back) are stored in the transaction of
        # its final event, ahead of the run's row: one commit fewer, the trace whole once the
        # run has ended, most often in one row. Spans cannot fail it (see tracing.py).
        spans = deps.tracing.sink.take(run_trace_id(run_id))
        stored = False
        try:
            before = in_order(checkpoint, spans.insert)
            if outcome.kind == "completed":
                stored = await _complete(writer, run, before)
            else:
                if outcome.kind == "failed":
                    data = outcome.data
                    log.info("run %s failed: %s: %s", run_id, data["errorType"], data["message"])
                kind = EventType(f"run.{outcome.kind}")
                stored = await _finish(writer, kind, outcome.data, before=before)
        finally:
            if not stored:  # the background flush stores them
                deps.tracing.sink.give_back(spans)
        return
    # The spans are stored before the run's next event, while the writer stores the events
    # still queued: neither waits for the other's commit. Errors are the writer's to raise, below.
    await asyncio.gather(_store_spans(deps, run_id), writer.flush(), return_exceptions=True)
    if outcome.kind == "suspended":
        # Stopped for a human or for child runs: store what it waits for, hold nothing.
        try:
            await suspend_run(deps.pool, deps.settings, writer, run, outcome.data["interrupts"])
        except (LeaseLostError, RunFinishedError) as exc:
            log.info("run %s: approvals not stored: %s", run_id, exc)
            pause = False
        if pause:  # asked while the step ran: pause now, approvals kept pending
            data = {"reason": "pause requested", "from": "waiting_user"}
            await _finish(writer, EventType.RUN_PAUSED, data, mark_paused)
        else:
            await writer.close()
    elif outcome.kind == "paused":
        await _finish(writer, EventType.RUN_PAUSED, outcome.data, mark_paused, checkpoint)
    elif outcome.kind == "abandoned":
        log.info("run %s: %s; stopped without writing", run_id, outcome.data["reason"])
        await writer.close()
    else:
        await _finish(writer, EventType(f"run.{outcome.kind}"), outcome.data, before=checkpoint)


async def _store_spans(deps: ExecutorDeps, run_id: str) -> None:
    try:
        await deps.tracing.sink.flush(run_trace_id(run_id))
    except Exception:
        log.exception("run %s: storing its spans failed; they will be retried", run_id)


async def _finish(
    writer: EventWriter,
    kind: EventType,
    data: Mapping[str, Any],
    extra: Any = None,
    before: Callable[[Conn], Awaitable[None]] | None = None,
) -> bool:
    """Store the run's last event (with `before` and `extra`), close the writer; say if stored."""
    try:
        await writer.finish(kind, data, extra, before)
        return True
    except (LeaseLostError, RunFinishedError) as exc:
        log.info("run %s: %s not stored: %s", writer.run_id, kind, exc)
        return False
    finally:
        await writer.close()


async def _complete(
    writer: EventWriter, run: Run, before: Callable[[Conn], Awaitable[None]]
) -> bool:
    message_id = new_id("msg")
    # What is still queued goes in the transaction of `run.completed`, and shapes its output.
    # Folded from events not all stored yet: a NUL character in them is replaced when they are.
    output = jsontext.storable(output_text((await writer.folded()).snapshot))

    async def store_message(conn: Conn, head: RunHead) -> None:
        await conn.execute(
            "INSERT INTO messages (id, conversation_id, tenant_id, user_id, run_id, role, content)"
            " VALUES (%s, %s, %s, %s, %s, 'assistant', %s)",
            (message_id, run.conversation_id, run.tenant_id, run.user_id, run.id, output),
        )
        # With the completion, so that a completed run never lacks its extraction job.
        await enqueue_extraction(conn, run)

    return await _finish(
        writer,
        EventType.RUN_COMPLETED,
        # The message stored with it holds the answer: the log keeps it once, there.
        answers.kept_answer(message_id, output),
        store_message,
        before,
    )
