"""The `knowledge` section: evidence retrieved for the current message (automatic RAG).

When the profile's knowledge mode is `auto`, before every model call it turns the current
message into a search query (through the profile's rewrite model when it names one, a call
metered like any other), searches the knowledge bases the run may use, drops duplicate and
weak chunks, compresses the rest to the section's token budget, and lists them with their
citation markers. The retrieval is reported as a `retrieval.completed` event.
"""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.config import get_stream_writer
from langgraph.runtime import get_runtime

from nodes.context.metadata import PURPOSE_KEY, STEP_KEY, call_metadata
from nodes.context.sections import ORDER_KNOWLEDGE, SectionItems, SectionRequest, SectionSpec
from nodes.context.tokens import EstimateCounter, message_text
from tools.knowledge.search import (
    KnowledgeAccess,
    KnowledgeHit,
    access_of,
    retrieval_event,
    retrieval_id,
)

KNOWLEDGE_HEADING = (
    "<knowledge>\nEvidence from the organisation's knowledge bases for the current message. "
    "Put the marker of each piece you rely on (such as [chk_0123abcd4567ef89]) right after "
    "the sentence it supports; if the evidence does not answer the question, say so."
)
KNOWLEDGE_END = "</knowledge>"
DEFAULT_KNOWLEDGE_BUDGET = 800
REWRITE_PROMPT = (
    "Rewrite the user's message as a short search query for a document search engine: the "
    "key terms and names only, no explanation. Answer with the query alone."
)
# Two chunks whose words overlap this much say the same thing (overlapping windows).
DUPLICATE_OVERLAP = 0.8
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\w+")
_counter = EstimateCounter()


def _current_text(request: SectionRequest) -> str:
    for message in reversed(request.messages):
        if isinstance(message, HumanMessage):
            return message_text(message)
    return ""


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if len(w) > 2}


def deduplicate(hits: list[KnowledgeHit]) -> list[KnowledgeHit]:
    """Drop hits whose words are mostly those of a better-ranked hit."""
    kept: list[tuple[KnowledgeHit, set[str]]] = []
    for hit in hits:
        words = _words(hit.text)
        if any(words and len(words & seen) / len(words) >= DUPLICATE_OVERLAP for _, seen in kept):
            continue
        kept.append((hit, words))
    return [hit for hit, _ in kept]


def compress(text: str, query: str, tokens: int) -> str:
    """Keep the sentences of `text` that share most words with `query`, in order, in budget."""
    if _counter.count(text) <= tokens:
        return text
    sentences = _SENTENCE.split(text)
    terms = _words(query)
    order = sorted(range(len(sentences)), key=lambda i: (-len(_words(sentences[i]) & terms), i))
    chosen: set[int] = set()
    used = 0
    for i in order:
        size = _counter.count(sentences[i]) + 1
        if used + size > tokens:
            continue
        chosen.add(i)
        used += size
    return " … ".join(sentences[i] for i in sorted(chosen))


def _label(hit: KnowledgeHit) -> str:
    where = " > ".join([hit.title, *hit.heading_path])
    page = f", p. {hit.page}" if hit.page else ""
    url = f" ({hit.source_url})" if hit.source_url else ""
    return f"[{hit.chunk_id}] {where}{page}{url}:"


def fit(hits: list[KnowledgeHit], query: str, budget: int) -> list[tuple[KnowledgeHit, str]]:
    """Return the hits that fit in `budget` tokens as items, compressed where needed."""
    items: list[tuple[KnowledgeHit, str]] = []
    left = budget - _counter.count(KNOWLEDGE_HEADING) - 2
    for hit in hits:
        label = _label(hit)
        room = left - _counter.count(label) - 1
        if room < 30:
            break
        text = compress(hit.text, query, room)
        if not text.strip():
            continue
        item = f"{label} {text}"
        items.append((hit, item))
        left -= _counter.count(item) + 1
    return items


async def _rewrite(access: KnowledgeAccess, text: str, step: int) -> str | None:
    """Ask the profile's rewrite model for a search query (None without one)."""
    if access.rewriter is None:
        return None
    with call_metadata(**{STEP_KEY: step, PURPOSE_KEY: "knowledge"}):
        answer = await access.rewriter.call(
            [SystemMessage(REWRITE_PROMPT), HumanMessage(text)], [], get_stream_writer(), step=step
        )
    rewritten = str(answer.text).strip().strip('"')
    return rewritten or None


def _step() -> int:
    config = var_child_runnable_config.get() or {}
    step = (config.get("metadata") or {}).get(STEP_KEY)
    return int(step) if isinstance(step, int) else 0


async def knowledge_section(request: SectionRequest) -> list[str]:
    """Retrieve evidence for the current message (none when automatic retrieval is off)."""
    access = access_of(request.options)
    text = _current_text(request)
    if access is None or access.mode != "auto" or not text.strip():
        return []
    step = _step()
    rewritten = await _rewrite(access, text, step)
    query = access.query(rewritten or text, tenant_id=request.tenant_id, run_id=request.run_id)
    result = await access.search.search(query)
    hits = deduplicate([h for h in result.hits if h.score >= access.min_score])
    items = fit(hits, rewritten or text, access.budget)
    attempt = getattr(getattr(get_runtime(), "context", None), "attempt", 1)
    event: dict[str, Any] = retrieval_event(
        retrieval=retrieval_id(request.run_id, "auto", step, attempt),
        mode="auto",
        query=text,
        rewritten=rewritten,
        result=result,
        used=[hit.chunk_id for hit, _ in items],
        step=step,
        top_k=access.top_k,
    )
    get_stream_writer()(event)
    return SectionItems(
        [item for _, item in items],
        [
            {"chunkId": hit.chunk_id, "rank": hit.rank, "score": round(hit.score, 6)}
            for hit, _ in items
        ],
    )


KNOWLEDGE_SECTION = SectionSpec(
    "knowledge",
    knowledge_section,
    ORDER_KNOWLEDGE,
    70,
    budget=DEFAULT_KNOWLEDGE_BUDGET,
    frame=(KNOWLEDGE_HEADING, KNOWLEDGE_END),
)
