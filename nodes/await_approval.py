"""The `await_approval` node: pause the run with `interrupt()` until a human decides.

The interrupt value (`ApprovalRequest`) and the resume value (`ApprovalResume`) are the
contract with the server, typed in graphs/approval.py.
"""

from __future__ import annotations

from typing import Any, cast

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from graphs.approval import (
    DECISIONS,
    ApprovalCall,
    ApprovalRequest,
    CallDecision,
    RequestKind,
)
from graphs.context import RunContext
from graphs.state import AgentState
from tools.policy import PreparedCall, Toolbox, prepare


def toolbox_of(context: RunContext) -> Toolbox:
    """Return the run's toolbox; without one, the context's tools under default policy."""
    if context.toolbox is not None:
        return context.toolbox
    return Toolbox.of(
        list(context.tools),
        run_id=context.run_id,
        tenant_id=context.tenant_id,
        user_id=context.user_id,
        default_timeout_s=context.tool_timeout_s,
    )


def prepare_calls(message: AIMessage, toolbox: Toolbox) -> list[PreparedCall]:
    """Run the pre-execution checks on every tool call of a model turn."""
    return [
        prepare(toolbox, call["id"] or f"{message.id}:{index}", call["name"], call["args"])
        for index, call in enumerate(message.tool_calls)
    ]


def run_decisions(state: AgentState, run_id: str) -> dict[str, dict[str, Any]]:
    """Return the decisions recorded in the state for this run's tool calls."""
    return {k: d for k, d in state.get("approvals", {}).items() if d.get("runId") == run_id}


def pending_approvals(state: AgentState, toolbox: Toolbox) -> list[PreparedCall]:
    """Return the last turn's calls that need a decision and have none yet."""
    last = state["messages"][-1]
    if not isinstance(last, AIMessage) or not last.tool_calls:
        return []
    decided = run_decisions(state, toolbox.run_id)
    return [
        c
        for c in prepare_calls(last, toolbox)
        if c.error is None and c.needs_approval and c.call_id not in decided
    ]


def decision_request(
    kind: RequestKind,
    toolbox: Toolbox,
    calls: list[PreparedCall],
    reasons: dict[str, str] | None = None,
) -> ApprovalRequest:
    """Build the interrupt value asking a human to decide on `calls`."""
    items: list[ApprovalCall] = []
    for call in calls:
        spec = call.spec
        override = toolbox.override(call.name)
        timeout = (override.approval_timeout_s if override else None) or (
            toolbox.config.approval_timeout_s
        )
        items.append(
            {
                "toolCallId": call.call_id,
                "name": call.name,
                "args": call.args,
                "redact": sorted(toolbox.redact_keys(spec)),
                "risk": spec.risk if spec else None,
                "source": spec.source if spec else None,
                "reason": (reasons or {}).get(call.call_id, call.approval_reason),
                "timeoutS": timeout,
            }
        )
    return {"kind": kind, "calls": items}


def read_decisions(answer: Any, calls: list[PreparedCall]) -> dict[str, CallDecision]:
    """Parse a resume value (`ApprovalResume`); a call without a valid decision is rejected."""
    given = answer.get("decisions", {}) if isinstance(answer, dict) else {}
    out: dict[str, CallDecision] = {}
    for call in calls:
        decision = given.get(call.call_id)
        if not isinstance(decision, dict) or decision.get("decision") not in DECISIONS:
            decision = {"decision": "reject", "reason": "no decision was given"}
        out[call.call_id] = cast(CallDecision, dict(decision))
    return out


async def await_approval(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Stop for a human decision on every call of the last turn that policy says needs one.

    Safe to re-execute: on resume LangGraph runs the node again and `interrupt()` returns the
    decisions instead of raising.
    """
    context = runtime.context or RunContext()
    toolbox = toolbox_of(context)
    pending = pending_approvals(state, toolbox)
    if not pending:
        return {}
    answer = interrupt(decision_request("approval", toolbox, pending))
    decisions = read_decisions(answer, pending)
    return {"approvals": {cid: {**d, "runId": context.run_id} for cid, d in decisions.items()}}
