"""Optional reranking of a search's hits by a cross-encoder endpoint (off by default).

The endpoint speaks the `/rerank` shape of Hugging Face's text-embeddings-inference and
similar servers: `{"query", "texts"}` in, `[{"index", "score"}]` out. A reranker that fails
leaves the fused order as it was: retrieval must not fail because its refinement did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Protocol

import httpx

from tools.knowledge.search import KnowledgeResult

log = logging.getLogger(__name__)


class Reranker(Protocol):
    """Reorders a search's hits by relevance to the query."""

    async def rerank(self, query: str, result: KnowledgeResult) -> KnowledgeResult:
        """Return `result` with its hits reordered (ranks and scores renewed)."""
        ...


@dataclass
class CrossEncoderReranker:
    """A cross-encoder behind HTTP (`AGENTRT_KNOWLEDGE_RERANK_URL`)."""

    url: str
    timeout_s: float = 10.0
    transport: httpx.AsyncBaseTransport | None = None

    async def rerank(self, query: str, result: KnowledgeResult) -> KnowledgeResult:
        """Score every hit against `query` and sort by that score."""
        try:
            async with httpx.AsyncClient(
                timeout=self.timeout_s, transport=self.transport
            ) as client:
                response = await client.post(
                    self.url, json={"query": query, "texts": [h.text for h in result.hits]}
                )
                response.raise_for_status()
                scores = {int(s["index"]): float(s["score"]) for s in response.json()}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("reranking skipped, fused order kept: %s", exc)
            return result
        order = sorted(
            range(len(result.hits)), key=lambda i: scores.get(i, float("-inf")), reverse=True
        )
        hits = [
            replace(result.hits[i], rank=rank, score=scores.get(i, 0.0))
            for rank, i in enumerate(order, start=1)
        ]
        return replace(result, hits=hits, reranked=True)
