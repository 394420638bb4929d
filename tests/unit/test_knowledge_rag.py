"""Automatic RAG's pieces: duplicates, compression to a budget, citations, the reranker."""

from __future__ import annotations

import json

import httpx
import pytest

from nodes.context.knowledge import KNOWLEDGE_SECTION, compress, deduplicate, fit
from nodes.context.tokens import EstimateCounter
from server.knowledge.rerank import CrossEncoderReranker
from tools.knowledge.search import KnowledgeHit, KnowledgeResult, retrieval_id

pytestmark = pytest.mark.timeout(30)
COUNTER = EstimateCounter()


def hit(rank: int, text: str, chunk: str | None = None) -> KnowledgeHit:
    return KnowledgeHit(
        chunk_id=chunk or f"chk_{rank:016x}",
        knowledge_base="handbook",
        document_id="doc_1",
        title="Handbook",
        position=rank,
        heading_path=("Travel", "Hotels"),
        page=None,
        source_url="https://docs.example.com/handbook",
        text=text,
        score=1 / (60 + rank),
        rank=rank,
    )


def test_overlapping_chunks_are_kept_once() -> None:
    first = hit(1, "Hotel costs are refunded up to 180 euros a night in Paris.")
    same = hit(2, "Hotel costs are refunded up to 180 euros a night in Paris, receipts needed.")
    other = hit(3, "Flights are booked through the Skyways portal.")
    assert deduplicate([first, same, other]) == [first, other]


def test_compression_keeps_the_sentences_that_share_the_querys_words() -> None:
    text = (
        "The office opens at nine. Parking is free for visitors. Hotel costs in Paris are "
        "refunded up to 180 euros a night. The canteen serves lunch until two."
    )
    short = compress(text, "hotel refund Paris", 20)
    assert "180 euros" in short and "canteen" not in short
    assert COUNTER.count(short) <= 20


def test_items_fit_the_budget_and_carry_citation_markers() -> None:
    hits = [hit(i, f"Fact {i}. " + "word " * 120) for i in range(1, 6)]
    items = fit(hits, "fact", 300)
    assert 1 <= len(items) < 5
    total = sum(COUNTER.count(text) + 1 for _, text in items)
    assert total <= 300
    for found, text in items:
        assert text.startswith(f"[{found.chunk_id}] Handbook > Travel > Hotels")
    assert KNOWLEDGE_SECTION.name == "knowledge" and KNOWLEDGE_SECTION.frame is not None


def test_citations_name_document_position_and_url() -> None:
    citation = hit(2, "x", "chk_00000000000000aa").citation()
    assert citation == {
        "marker": "[chk_00000000000000aa]",
        "knowledgeBase": "handbook",
        "documentId": "doc_1",
        "title": "Handbook",
        "position": 2,
        "headingPath": ["Travel", "Hotels"],
        "page": None,
        "url": "https://docs.example.com/handbook",
    }
    assert retrieval_id("run_1", "tool", "call_1") == retrieval_id("run_1", "tool", "call_1")
    assert retrieval_id("run_1", "tool", "call_1") != retrieval_id("run_1", "tool", "call_2")


async def test_the_cross_encoder_reorders_hits_and_a_failure_keeps_the_fused_order() -> None:
    result = KnowledgeResult([hit(1, "weak"), hit(2, "strong")], ["handbook"])

    def scores(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body == {"query": "q", "texts": ["weak", "strong"]}
        return httpx.Response(200, json=[{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}])

    reranked = await CrossEncoderReranker(
        "http://rerank.test/rerank", transport=httpx.MockTransport(scores)
    ).rerank("q", result)
    assert [(h.text, h.rank, h.score) for h in reranked.hits] == [
        ("strong", 1, 0.9),
        ("weak", 2, 0.1),
    ]
    assert reranked.reranked

    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    kept = await CrossEncoderReranker(
        "http://rerank.test/rerank", transport=httpx.MockTransport(broken)
    ).rerank("q", result)
    assert kept == result
