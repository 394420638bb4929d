"""The agent's graph state and its reducers."""

from __future__ import annotations

from typing import Annotated, Any, NotRequired, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages


class AgentState(TypedDict):
    """State carried between nodes and saved in every checkpoint.

    Attributes:
        messages: The conversation, appended to by nodes (`add_messages` merges by id).
        run_id: The run that last wrote to this thread; a resumed run checks it.
        step: Model calls made by the current run.
        context_manifest: What went into the last model call and why (SPEC §3).
    """

    messages: Annotated[list[AnyMessage], add_messages]
    run_id: NotRequired[str]
    step: NotRequired[int]
    context_manifest: NotRequired[dict[str, Any]]
