"""The `memory` section: what long-term memory knows that bears on the current message.

It searches the user's and the tenant's memories in the store the graph was compiled with
(reached through LangGraph's runtime) with the current message, ranks by similarity blended
with recency, keeps those over the profile's similarity floor, and lists them between
`<memory>` tags; the manifest records each item kept with its id and scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.config import get_store

from nodes.context.sections import ORDER_MEMORY, SectionItems, SectionRequest, SectionSpec
from nodes.context.tokens import message_text
from tools.memory.book import Memory, MemoryBook, policy_from

MEMORY_HEADING = (
    "<memory>\nLong-term memory: what earlier conversations taught about this user and "
    "tenant. It may be out of date; what the user says now wins."
)
MEMORY_END = "</memory>"
DEFAULT_MEMORY_BUDGET = 600


def memory_options(request: SectionRequest) -> Mapping[str, Any]:
    """Return the run's memory settings (the profile's, resolved by the server)."""
    options = request.options.get("memory")
    return options if isinstance(options, Mapping) else {}


def _current_text(request: SectionRequest) -> str:
    for message in reversed(request.messages):
        if isinstance(message, HumanMessage):
            return message_text(message)
    return ""


def _line(memory: Memory) -> str:
    whose = "shared" if memory.scope == "tenant" else "user"
    return f"- [{memory.kind}, {whose}] {memory.text}"


async def memory_section(request: SectionRequest) -> list[str]:
    """Recall the memories that bear on the current message (none when memory is off)."""
    options = memory_options(request)
    recall = options.get("recall") or {}
    if options.get("mode", "off") == "off" or not recall.get("enabled", True):
        return []
    try:
        store = get_store()
    except RuntimeError:  # outside a graph run: nothing to recall from
        return []
    query = _current_text(request)
    if store is None or not query.strip():
        return []
    found = await MemoryBook(store).recall(
        request.tenant_id, request.user_id, query, policy_from(recall)
    )
    return SectionItems(
        [_line(m) for m in found],
        [
            {
                "id": m.id,
                "scope": m.scope,
                "kind": m.kind,
                "similarity": round(m.similarity or 0.0, 4),
                "score": round(m.score or 0.0, 4),
            }
            for m in found
        ],
    )


MEMORY_SECTION = SectionSpec(
    "memory",
    memory_section,
    ORDER_MEMORY,
    60,
    budget=DEFAULT_MEMORY_BUDGET,
    frame=(MEMORY_HEADING, MEMORY_END),
)
