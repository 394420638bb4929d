"""The agent's graph state and its reducers."""

from __future__ import annotations

from typing import Annotated, Any, NotRequired, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages


def merge_approvals(
    left: dict[str, dict[str, Any]] | None, right: dict[str, dict[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """Add reviewers' decisions (by tool call id), dropping those of earlier runs."""
    right = right or {}
    runs = {d.get("runId") for d in right.values()}
    kept = {k: d for k, d in (left or {}).items() if d.get("runId") in runs}
    return {**kept, **right}


def merge_token_counts(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """Keep every message's token count; a change of tokenizer starts the counts afresh."""
    right = right or {}
    if "@tokenizer" in right and (left or {}).get("@tokenizer") != right["@tokenizer"]:
        return dict(right)
    return {**(left or {}), **right}


class AgentState(TypedDict):
    """State carried between nodes and saved in every checkpoint.

    Attributes:
        messages: The conversation, appended to by nodes (`add_messages` merges by id).
        run_id: The run that last wrote to this thread; a resumed run checks it.
        step: Model calls made by the current run.
        context_manifest: What went into the last model call and why.
        approvals: Reviewers' decisions on the current run's tool calls, by tool call id.
        token_counts: Each message's token count by message id (counted once, kept), with
            the tokenizer's name under `@tokenizer`.
        plan: The run's plan: `runId`, `revision` and its `steps` (tools/plan/model.py).
        skills: The skills the run loaded: `runId` and, by name, the pinned version.
    """

    messages: Annotated[list[AnyMessage], add_messages]
    run_id: NotRequired[str]
    step: NotRequired[int]
    context_manifest: NotRequired[dict[str, Any]]
    approvals: NotRequired[Annotated[dict[str, dict[str, Any]], merge_approvals]]
    token_counts: NotRequired[Annotated[dict[str, Any], merge_token_counts]]
    plan: NotRequired[dict[str, Any]]
    skills: NotRequired[dict[str, Any]]
