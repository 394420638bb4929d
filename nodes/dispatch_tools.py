"""The `dispatch_tools` node: run the last model turn's tool calls through the tool pipeline.

Calls run concurrently up to the tenant's `max_parallel_tools`. Every call is claimed in the
tool ledger first, so a replay after a crash reuses recorded outcomes. A call an earlier
attempt started but never finished, of a tool that cannot safely run twice, stops the run for
a human decision (`interrupt()`, kind `in_doubt`) instead of guessing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from graphs.context import RunContext
from graphs.events import Emit
from graphs.state import AgentState
from nodes.await_approval import (
    decision_request,
    prepare_calls,
    read_decisions,
    run_decisions,
    toolbox_of,
)
from nodes.state_tools import apply_results, refusals, state_view
from tools.delegate import DELEGATE_TOOL
from tools.errors import ToolCallError
from tools.ledger import Claim, Outcome
from tools.pipeline import ToolResult, budget_for, claim, execute, refuse, replay
from tools.policy import PreparedCall, Toolbox, prepare
from tools.run_state import viewing

IN_DOUBT_REASON = (
    "an earlier attempt started this call and crashed before recording its outcome; the tool "
    "cannot be run twice safely, so a person must decide whether to run it again"
)


def _edited(toolbox: Toolbox, call: PreparedCall, decision: Mapping[str, Any]) -> PreparedCall:
    """Return `call` with a reviewer's edited arguments, checked again."""
    edited = prepare(toolbox, call.call_id, call.name, decision.get("args") or {})
    return PreparedCall(edited.call_id, edited.name, edited.args, edited.spec, edited.error)


def _with_decision(
    toolbox: Toolbox, call: PreparedCall, decision: Mapping[str, Any] | None
) -> tuple[PreparedCall, list[str]] | ToolCallError:
    """Apply a reviewer's decision: the call to run (and notes for the model), or a refusal."""
    if decision is None:
        return ToolCallError("rejected", "the call needs approval and none was recorded")
    by = decision.get("by") or "a reviewer"
    if decision["decision"] == "reject":
        reason = decision.get("reason") or "no reason given"
        return ToolCallError("rejected", f"{by} rejected this call: {reason}")
    if decision["decision"] == "edit":
        edited = _edited(toolbox, call, decision)
        if edited.error is not None:
            return edited.error
        note = f"[{by} edited the arguments before running this call: {json.dumps(edited.args)}]"
        return edited, [note]
    return call, []


async def _run(
    toolbox: Toolbox, call: PreparedCall, notes: list[str], emit: Emit
) -> ToolResult | PreparedCall:
    """Claim and execute one call; return the call itself when its outcome is in doubt."""
    state, entry = await claim(toolbox, call)
    if state == Claim.NEW:
        return await execute(toolbox, call, emit, notes=notes)
    if state == Claim.RECORDED:
        return replay(toolbox, call, entry, emit)
    if state == Claim.BUSY:
        error = ToolCallError("error", f"tool call id {call.call_id!r} is used twice in one turn")
        return refuse(toolbox, call, error, emit)
    assert call.spec is not None
    if not call.spec.safe_to_rerun:
        return call
    if not await toolbox.ledger.take_over(toolbox.run_id, call.call_id, toolbox.generation):
        error = ToolCallError("error", "a newer attempt of this run took the call over")
        return refuse(toolbox, call, error, emit)
    return await execute(toolbox, call, emit, prior_attempts=entry.attempts + 1, notes=notes)


async def _decide_in_doubt(
    toolbox: Toolbox, calls: list[PreparedCall], emit: Emit
) -> dict[str, ToolResult]:
    """Ask a human about in-doubt calls (interrupts), then re-run or close each one."""
    answer = interrupt(
        decision_request("in_doubt", toolbox, calls, {c.call_id: IN_DOUBT_REASON for c in calls})
    )
    decisions = read_decisions(answer, calls)
    results: dict[str, ToolResult] = {}
    for call in calls:
        _, entry = await claim(toolbox, call)
        if entry.status != "started":
            results[call.call_id] = replay(toolbox, call, entry, emit)
            continue
        taken = await toolbox.ledger.take_over(toolbox.run_id, call.call_id, toolbox.generation)
        outcome = _with_decision(toolbox, call, decisions[call.call_id])
        if isinstance(outcome, ToolCallError) or not taken:
            error = (
                outcome
                if isinstance(outcome, ToolCallError)
                else ToolCallError("error", "a newer attempt of this run took the call over")
            )
            result = refuse(toolbox, call, error, emit)
            closed = Outcome(
                "failed",
                0,
                0.0,
                error=f"not run again: {error.message}",
                error_type=error.error_type,
            )
            await toolbox.ledger.store(toolbox.run_id, call.call_id, toolbox.generation, closed)
        else:
            prepared, notes = outcome
            notes = ["[this call was interrupted by a crash; a person had it run again]", *notes]
            result = await execute(
                toolbox, prepared, emit, prior_attempts=entry.attempts + 1, notes=notes
            )
        results[call.call_id] = result
    return results


async def dispatch_tools(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Run every tool call of the last model turn and append one ToolMessage per call."""
    context = runtime.context or RunContext()
    toolbox = toolbox_of(context)
    emit: Emit = runtime.stream_writer
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    decisions = run_decisions(state, context.run_id)
    # `delegate` calls are the delegate_subagents node's, which runs next.
    calls = [c for c in prepare_calls(last, toolbox) if c.name != DELEGATE_TOOL]
    refused = refusals(state, calls, context)
    results: dict[str, ToolResult] = {}
    to_run: list[tuple[PreparedCall, list[str]]] = []
    for call in calls:
        error = call.error or refused.get(call.call_id)
        if error is not None:
            results[call.call_id] = refuse(toolbox, call, error, emit)
            continue
        outcome = (
            _with_decision(toolbox, call, decisions.get(call.call_id))
            if call.needs_approval
            else (call, [])
        )
        if isinstance(outcome, ToolCallError):
            results[call.call_id] = refuse(toolbox, call, outcome, emit)
        else:
            to_run.append(outcome)

    limit = asyncio.Semaphore(toolbox.config.max_parallel_tools)

    async def run_limited(call: PreparedCall, notes: list[str]) -> ToolResult | PreparedCall:
        async with limit:
            return await _run(toolbox, call, notes, emit)

    try:
        with viewing(state_view(state, context)):
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(run_limited(call, notes)) for call, notes in to_run]
    except BaseExceptionGroup as failed:
        # Surface the first error itself: LangGraph must see a GraphInterrupt, not a group.
        first = next(
            (e for e in failed.exceptions if isinstance(e, GraphBubbleUp)), failed.exceptions[0]
        )
        raise first from None
    in_doubt: list[PreparedCall] = []
    for task in tasks:
        done = task.result()
        if isinstance(done, ToolResult):
            results[done.call_id] = done
        else:
            in_doubt.append(done)
    if in_doubt:
        with viewing(state_view(state, context)):
            results.update(await _decide_in_doubt(toolbox, in_doubt, emit))

    update = apply_results(state, calls, results, emit)
    messages: list[ToolMessage] = []
    for call in calls:
        result = results[call.call_id]
        messages.append(result.to_message(budget_for(toolbox, call.spec)))
    # Run again, the step replays the outcomes the ledger recorded: its checkpoint may wait.
    context.checkpoint_may_wait()
    return {"messages": messages, **update}
