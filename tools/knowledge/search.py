"""What the knowledge tool and the `knowledge` section ask of a knowledge search, and its record.

The server implements `KnowledgeSearch` on Postgres (server/knowledge/search.py) and hands
it to a run with the profile's knowledge policy (`KnowledgeAccess`), so that tools and
nodes search without importing the server. Every retrieval is reported as one
`retrieval.completed` event, built here, which the server stores as the evidence record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from graphs.events import EventType

MAX_TOP_K = 20


@dataclass(frozen=True)
class KnowledgeQuery:
    """One search, with who asks: tenant, agent profile and roles are filters in SQL.

    Attributes:
        text: The search text.
        tenant_id, profile, roles: Whose search (the knowledge bases' access lists).
        knowledge_bases: Names to search (of those allowed); None: every allowed one.
        top_k: How many chunks to return.
        filters: Metadata the chunks' documents must have (equality on each key).
        run_id: The run searching, for the trace.
    """

    text: str
    tenant_id: str
    profile: str | None = None
    roles: frozenset[str] = frozenset()
    knowledge_bases: Sequence[str] | None = None
    top_k: int = 5
    filters: Mapping[str, str] = field(default_factory=dict)
    run_id: str | None = None


@dataclass(frozen=True)
class KnowledgeHit:
    """One chunk found, with what a citation needs.

    Attributes:
        chunk_id: Its id; `[chunk_id]` is its citation marker.
        rank: 1 for the best; `score` is its fused (or reranked) score.
        vector_rank, text_rank: Its rank in the similarity and the full-text lists (None:
            not in that list).
    """

    chunk_id: str
    knowledge_base: str
    document_id: str
    title: str
    position: int
    heading_path: tuple[str, ...]
    page: int | None
    source_url: str | None
    text: str
    score: float
    rank: int
    vector_rank: int | None = None
    text_rank: int | None = None

    def citation(self) -> dict[str, Any]:
        """Return where the chunk comes from: document title, position, page, URL."""
        return {
            "marker": f"[{self.chunk_id}]",
            "knowledgeBase": self.knowledge_base,
            "documentId": self.document_id,
            "title": self.title,
            "position": self.position,
            "headingPath": list(self.heading_path),
            "page": self.page,
            "url": self.source_url,
        }

    def evidence(self) -> dict[str, Any]:
        """Return the chunk as the evidence record lists it."""
        return {
            "chunkId": self.chunk_id,
            "documentId": self.document_id,
            "knowledgeBase": self.knowledge_base,
            "rank": self.rank,
            "score": round(self.score, 6),
            "vectorRank": self.vector_rank,
            "textRank": self.text_rank,
        }


@dataclass(frozen=True)
class KnowledgeResult:
    """A search's hits, and which knowledge bases it searched and which it was refused."""

    hits: list[KnowledgeHit]
    searched: list[str]
    denied: list[str] = field(default_factory=list)
    reranked: bool = False


class KnowledgeSearch(Protocol):
    """Hybrid search over the knowledge bases a query may see."""

    async def search(self, query: KnowledgeQuery) -> KnowledgeResult:
        """Return the best chunks for `query`, filtered by tenant and access in the search."""
        ...


@dataclass(frozen=True)
class KnowledgeAccess:
    """A run's knowledge: the search, who searches, and the profile's policy.

    Attributes:
        search: The server's search.
        profile, roles: Who searches (the tenant is the run's).
        knowledge_bases: The profile's knowledge bases; empty: every one it may access.
        mode: `off`, `tool` (the `search_knowledge` tool), or `auto` (the tool and the
            automatic `knowledge` section).
        top_k: Chunks per automatic retrieval (and the tool's default).
        budget: The `knowledge` section's token budget.
        rewrite_model: A model that turns the message into a search query (auto mode);
            None: the message itself, stripped of filler words.
        min_score: Automatic retrieval leaves out chunks under this fused score.
        rewriter: The rewrite model's caller (a `graphs.context.ModelCaller` sharing the
            run's usage meter), or None.
    """

    search: KnowledgeSearch
    profile: str
    roles: frozenset[str] = frozenset()
    knowledge_bases: tuple[str, ...] = ()
    mode: Literal["off", "tool", "auto"] = "off"
    top_k: int = 5
    budget: int = 800
    rewrite_model: str | None = None
    min_score: float = 0.0
    rewriter: Any = None

    def query(
        self,
        text: str,
        *,
        tenant_id: str,
        run_id: str | None,
        knowledge_base: str | None = None,
        top_k: int | None = None,
    ) -> KnowledgeQuery:
        """Return a query of this run's (the named base, else the profile's bases)."""
        bases: Sequence[str] | None = [knowledge_base] if knowledge_base else None
        if bases is None and self.knowledge_bases:
            bases = list(self.knowledge_bases)
        elif bases and self.knowledge_bases and knowledge_base not in self.knowledge_bases:
            bases = []  # a base the profile does not use is refused like a forbidden one
        return KnowledgeQuery(
            text=text,
            tenant_id=tenant_id,
            profile=self.profile,
            roles=self.roles,
            knowledge_bases=bases,
            top_k=top_k or self.top_k,
            run_id=run_id,
        )


def retrieval_id(run_id: str, *parts: object) -> str:
    """Return a stable id for a retrieval, so that a replayed one is stored once."""
    digest = hashlib.sha256("|".join([run_id, *map(str, parts)]).encode()).hexdigest()
    return f"rtv_{digest[:20]}"


def retrieval_event(
    *,
    retrieval: str,
    mode: Literal["tool", "auto"],
    query: str,
    rewritten: str | None,
    result: KnowledgeResult,
    used: Sequence[str],
    step: int | None,
    tool_call_id: str | None = None,
    top_k: int,
) -> dict[str, Any]:
    """Return the `retrieval.completed` event of one retrieval (its evidence record)."""
    return {
        "event": EventType.RETRIEVAL_COMPLETED,
        "retrievalId": retrieval,
        "mode": mode,
        "query": query,
        "rewrittenQuery": rewritten,
        "knowledgeBases": result.searched,
        "denied": result.denied,
        "topK": top_k,
        "reranked": result.reranked,
        "chunks": [h.evidence() for h in result.hits],
        "used": list(used),
        "step": step,
        "toolCallId": tool_call_id,
    }


def access_of(options: Mapping[str, object] | None) -> KnowledgeAccess | None:
    """Return the run's `KnowledgeAccess` from the context setup's section options."""
    if not isinstance(options, Mapping):
        return None
    access = options.get("knowledge")
    return access if isinstance(access, KnowledgeAccess) else None
