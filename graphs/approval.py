"""The approval contract between the graph and the server: interrupt and resume values.

The `await_approval` node stops with `interrupt(ApprovalRequest)`; the server turns it into
approval records and `approval.required` events, and the decisions into
`Command(resume=ApprovalResume)`. Both travel through the checkpoint as JSON, hence the
camelCase keys.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict, cast

RequestKind = Literal["approval", "in_doubt"]
Decision = Literal["approve", "reject", "edit"]
DECISIONS: frozenset[str] = frozenset({"approve", "reject", "edit"})


class ApprovalCall(TypedDict):
    """One tool call a human must decide on."""

    toolCallId: str
    name: str
    args: dict[str, Any]
    redact: list[str]
    risk: str | None
    source: str | None
    reason: str
    timeoutS: float | None


class ApprovalRequest(TypedDict):
    """The interrupt value: what kind of decision is asked, and on which calls."""

    kind: RequestKind
    calls: list[ApprovalCall]


class CallDecision(TypedDict):
    """A decision on one call; `args` replaces the call's arguments on `edit`."""

    decision: Decision
    args: NotRequired[dict[str, Any] | None]
    reason: NotRequired[str | None]
    by: NotRequired[str]
    approvalId: NotRequired[str]


class ApprovalResume(TypedDict):
    """The resume value: a decision per tool call id."""

    decisions: dict[str, CallDecision]


def request_calls(value: Any) -> list[ApprovalCall]:
    """Return the calls of an interrupt value (none when it is not an approval request)."""
    calls = value.get("calls", []) if isinstance(value, dict) else []
    return list(calls)


def request_kind(value: Any) -> RequestKind:
    """Return the kind of an interrupt value (`approval` unless it says otherwise)."""
    kind = value.get("kind", "approval") if isinstance(value, dict) else "approval"
    return cast(RequestKind, kind)
