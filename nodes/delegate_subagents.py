"""The `delegate_subagents` node: hand the turn's `delegate` calls to child runs and wait.

The node stops with `interrupt(SubagentRequest)`; the server starts one child run per call and
resumes the node with their results when the last one ends (graphs/subagent.py), so the
parent holds no worker meanwhile. On resume LangGraph runs the node again and `interrupt()`
returns the results, which become the calls' tool results; each is recorded once in the
tool ledger.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

import jsonschema
from langchain_core.messages import AIMessage, BaseMessage, ToolCall, ToolMessage
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from graphs.context import RunContext
from graphs.events import Emit
from graphs.state import AgentState
from graphs.subagent import ChildResult, Delegation, SubagentRequest
from nodes.await_approval import prepare_calls, run_decisions, toolbox_of
from tools.delegate import DELEGATE_TOOL
from tools.errors import ToolCallError
from tools.ledger import Claim, Outcome
from tools.pipeline import ToolResult, budget_for, claim, finished_event, refuse, started_event
from tools.policy import PreparedCall, Toolbox, prepare

MISSING_RESULT: ChildResult = {
    "status": "failed",
    "childRunId": None,
    "output": "",
    "error": "no result was recorded for this delegation",
}


class SubagentFailedError(Exception):
    """A child run failed and its delegation said to fail the parent (`onFailure: fail`)."""


def last_answer(messages: Sequence[BaseMessage]) -> AIMessage | None:
    """Return the model's last answer in `messages`."""
    return next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)


def open_delegations(state: AgentState) -> list[ToolCall]:
    """Return the last answer's `delegate` calls that have no tool result yet."""
    messages = state["messages"]
    answer = last_answer(messages)
    if answer is None:
        return []
    at = max(i for i, m in enumerate(messages) if m is answer)
    answered = {m.tool_call_id for m in messages[at:] if isinstance(m, ToolMessage)}
    return [
        call
        for call in answer.tool_calls
        if call["name"] == DELEGATE_TOOL and call["id"] not in answered
    ]


def _delegation(call: PreparedCall) -> Delegation:
    args = call.args
    return {
        "toolCallId": call.call_id,
        "agent": args.get("agent"),
        "task": args["task"],
        "expectedOutput": args.get("expected_output"),
        "outputSchema": args.get("output_schema"),
        "tools": args.get("tools"),
        "budgetShare": args.get("budget_share"),
        "onFailure": args.get("on_failure") or "tool_error",
    }


def _decided(
    toolbox: Toolbox, call: PreparedCall, decision: Mapping[str, Any] | None
) -> PreparedCall | ToolCallError:
    """Apply a reviewer's decision on a delegation that needed one."""
    if decision is None or decision.get("decision") == "reject":
        reason = (decision or {}).get("reason") or "no decision was recorded"
        return ToolCallError("rejected", f"the delegation was rejected: {reason}")
    if decision.get("decision") == "edit":
        edited = prepare(toolbox, call.call_id, call.name, decision.get("args") or {})
        return edited.error or edited
    return call


def _parse_output(result: ChildResult, schema: Mapping[str, Any]) -> str:
    """Return the child's answer as JSON valid against `schema`, or raise ToolCallError."""
    text = result.get("output", "").strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(text)
        jsonschema.validate(value, dict(schema))
    except (ValueError, jsonschema.ValidationError) as exc:
        message = getattr(exc, "message", str(exc))
        raise ToolCallError(
            "invalid_output", f"the subagent's answer does not match the expected schema: {message}"
        ) from exc
    return json.dumps(value)


def _result(call: PreparedCall, delegation: Delegation, result: ChildResult) -> ToolResult:
    """Turn a child's outcome into the delegate call's tool result (or fail the parent)."""
    child = result.get("childRunId")
    schema = delegation["outputSchema"]
    try:
        if result["status"] != "completed":
            error = result.get("error") or f"the subagent run ended {result['status']}"
            raise ToolCallError("tool_error", f"subagent run {child} {result['status']}: {error}")
        output = result.get("output", "")
        if schema is not None:
            output = _parse_output(result, schema)
    except ToolCallError as exc:
        if delegation["onFailure"] == "fail":
            raise SubagentFailedError(exc.message) from None
        return ToolResult(
            call.call_id, call.name, "failed", exc.message, exc.error_type, attempts=1
        )
    return ToolResult(call.call_id, call.name, "completed", output, attempts=1)


async def _record(toolbox: Toolbox, call: PreparedCall, result: ToolResult, emit: Emit) -> None:
    """Record the delegation's outcome in the tool ledger once, with its tool events."""
    state, _ = await claim(toolbox, call)
    if state == Claim.NEW:
        status = result.status
        outcome = Outcome(
            status,
            1,
            0.0,
            output=result.output if status == "completed" else None,
            error=result.output if status == "failed" else None,
            error_type=result.error_type,
        )
        await toolbox.ledger.store(toolbox.run_id, call.call_id, toolbox.generation, outcome)
    emit(started_event(toolbox, call, attempt=1, replayed=state != Claim.NEW))
    emit(finished_event(result, budget_for(toolbox, call.spec)))


async def delegate_subagents(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Start a child run for each `delegate` call of the last turn; return their results.

    Safe to re-execute: the server starts each call's child once, and on resume the
    interrupt returns the results instead of raising.
    """
    context = runtime.context or RunContext()
    toolbox = toolbox_of(context)
    emit: Emit = runtime.stream_writer
    answer = last_answer(state["messages"])
    open_ids = {c["id"] for c in open_delegations(state)}
    if answer is None or not open_ids:
        return {}
    decisions = run_decisions(state, context.run_id)
    results: dict[str, ToolResult] = {}
    to_start: list[tuple[PreparedCall, Delegation]] = []
    refused: list[tuple[PreparedCall, ToolCallError]] = []
    for call in prepare_calls(answer, toolbox):
        if call.call_id not in open_ids:
            continue
        checked: PreparedCall | ToolCallError = call.error or call
        if call.error is None and call.needs_approval:
            checked = _decided(toolbox, call, decisions.get(call.call_id))
        if isinstance(checked, ToolCallError):
            refused.append((call, checked))
        else:
            to_start.append((checked, _delegation(checked)))
    if to_start:
        request: SubagentRequest = {"kind": "subagents", "delegations": [d for _, d in to_start]}
        resumed = interrupt(request)
        given = resumed.get("results", {}) if isinstance(resumed, dict) else {}
        for call, delegation in to_start:
            outcome = cast(ChildResult, given.get(call.call_id) or MISSING_RESULT)
            result = _result(call, delegation, outcome)
            await _record(toolbox, call, result, emit)
            results[call.call_id] = result
    # Reported once the node is past its interrupt, so a resumed node does not repeat them.
    for call, error in refused:
        results[call.call_id] = refuse(toolbox, call, error, emit)
    messages: list[ToolMessage] = []
    for call in prepare_calls(answer, toolbox):
        if call.call_id in results:
            messages.append(results[call.call_id].to_message(budget_for(toolbox, call.spec)))
    return {"messages": messages}
