"""The `search_knowledge` tool: hybrid search of the knowledge bases the run may use.

It reaches the search and the profile's knowledge policy through the run's context setup
(LangGraph's runtime), and reports every search as a `retrieval.completed` event, the
evidence record of the call.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from langchain_core.tools import ToolException
from langgraph.config import get_stream_writer
from langgraph.runtime import get_runtime

from tools.knowledge.search import (
    MAX_TOP_K,
    KnowledgeAccess,
    access_of,
    retrieval_event,
    retrieval_id,
)
from tools.spec import CallContext, ToolSpec, agent_tool

KNOWLEDGE_TOOLS = ("search_knowledge",)
MAX_CHUNK_CHARS = 2_000


def _run_access() -> KnowledgeAccess:
    """Return the run's knowledge access, or refuse plainly."""
    try:
        context = getattr(get_runtime(), "context", None)
    except RuntimeError as exc:
        raise ToolException("search_knowledge runs only inside an agent run") from exc
    setup = getattr(context, "context_setup", None)
    access = access_of(getattr(setup, "section_options", None))
    if access is None or access.mode == "off":
        raise ToolException("knowledge search is off for this agent")
    return access


def _emit(event: dict[str, Any]) -> None:
    # Outside a graph run there is nobody to report to.
    with contextlib.suppress(RuntimeError):
        get_stream_writer()(event)


@agent_tool(idempotent=True)
async def search_knowledge(
    query: str,
    call: CallContext,
    knowledge_base: str | None = None,
    top_k: int = 5,
) -> str:
    """Search the company's knowledge bases (documents, manuals, policies) for evidence.

    Use it before answering questions about the organisation's products, policies or
    documents. Each result carries a citation marker such as `[chk_0123abcd4567ef89]`: put
    the marker of every result you rely on right after the sentence it supports.

    Args:
        query: What to look for: a short, specific question or key words.
        knowledge_base: The name of one knowledge base to search; all you may use if unset.
        top_k: How many results to return (1-20).
    """
    access = _run_access()
    if not 1 <= top_k <= MAX_TOP_K:
        raise ToolException(f"top_k must be between 1 and {MAX_TOP_K}")
    if not query.strip():
        raise ToolException("query must not be empty")
    search = access.query(
        query,
        tenant_id=call.tenant_id,
        run_id=call.run_id,
        knowledge_base=knowledge_base,
        top_k=top_k,
    )
    result = await access.search.search(search)
    _emit(
        retrieval_event(
            retrieval=retrieval_id(call.run_id, "tool", call.tool_call_id),
            mode="tool",
            query=query,
            rewritten=None,
            result=result,
            used=[h.chunk_id for h in result.hits],
            step=None,
            tool_call_id=call.tool_call_id,
            top_k=top_k,
        )
    )
    if knowledge_base and knowledge_base not in result.searched:
        raise ToolException(
            f"knowledge base {knowledge_base!r} does not exist or this agent may not search "
            f"it; searchable: {', '.join(result.searched) or 'none'}"
        )
    return json.dumps(
        {
            "results": [
                {**h.citation(), "score": round(h.score, 4), "text": h.text[:MAX_CHUNK_CHARS]}
                for h in result.hits
            ],
            "searched": result.searched,
        }
    )


def knowledge_tools() -> list[ToolSpec]:
    """Return the knowledge tools."""
    return [search_knowledge]
