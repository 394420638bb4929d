"""The subagent contract between the graph and the server: interrupt and resume values.

The `delegate_subagents` node stops with `interrupt(SubagentRequest)`; the server starts one
child run per delegation (once, whatever the replays) and, when the last child ends, resumes
the parent with `Command(resume=SubagentResume)`. Both travel through the checkpoint as JSON,
hence the camelCase keys. This module imports nothing of ours.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

SUBAGENTS_KIND = "subagents"
FailurePolicy = Literal["tool_error", "fail"]


class Delegation(TypedDict):
    """One `delegate` call: which agent does what, and what the parent expects back."""

    toolCallId: str
    agent: str | None
    task: str
    expectedOutput: str | None
    outputSchema: dict[str, Any] | None
    tools: list[str] | None
    budgetShare: float | None
    onFailure: FailurePolicy


class SubagentRequest(TypedDict):
    """The interrupt value: the delegations of one model turn."""

    kind: Literal["subagents"]
    delegations: list[Delegation]


class ChildResult(TypedDict):
    """How one delegation ended: the child's final status and answer, or why it failed."""

    status: str
    childRunId: str | None
    output: str
    error: NotRequired[str | None]
    usage: NotRequired[dict[str, Any]]


class SubagentResume(TypedDict):
    """The resume value: a result per tool call id."""

    results: dict[str, ChildResult]


def is_subagent_request(value: Any) -> bool:
    """Say whether an interrupt value asks for subagents (rather than a human decision)."""
    return isinstance(value, dict) and value.get("kind") == SUBAGENTS_KIND


def request_delegations(value: Any) -> list[Delegation]:
    """Return the delegations of an interrupt value (none when it asks for something else)."""
    return list(value.get("delegations", [])) if is_subagent_request(value) else []
