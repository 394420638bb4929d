"""Knowledge: retrieval quality on the evaluation set, and hybrid search latency at scale.

Quality: the documents of bench/data/knowledge_eval.json (World Factbook country profiles,
public domain) are ingested through the real jobs with the offline embedder; each of its 50
questions has one relevant section; recall@5 and MRR (over the top 10) are measured for
vector-only, full-text-only and hybrid search. Latency: synthetic chunks made of the set's
sentences are COPied into one knowledge base (10,000, then 100,000; 1,000,000 in
`make bench-large`), and searches are timed through the same code as the tool's (embed the
query, one fused statement, tenant and access filters in SQL).
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import Figures, met, run_async, stat_line
from nodes.embeddings.lexical import lexical_vector
from server.auth import Principal
from server.db.pool import Pool, migrate, open_pool
from server.knowledge.cells import train_cells
from server.knowledge.jobs import KnowledgeJobs
from server.knowledge.search import (
    Method,
    PostgresKnowledgeSearch,
    hybrid_sql,
    text_params,
    vector_literal,
)
from server.knowledge.service import KnowledgeService
from server.knowledge.setup import knowledge_index_kind, open_knowledge
from server.settings import Settings
from tools.knowledge.search import KnowledgeQuery

EVAL = Path(__file__).resolve().parent / "data" / "knowledge_eval.json"
TENANT = "bench"
ADMIN = Principal(TENANT, "bench", frozenset({"admin"}))
METHODS: tuple[Method, ...] = ("vector", "text", "hybrid")


def load_eval() -> dict[str, Any]:
    """Return the evaluation set: `documents` (title, Markdown text) and `questions`."""
    return dict(json.loads(EVAL.read_text(encoding="utf-8")))


def settings_for(database_url: str) -> Settings:
    """Settings of a benchmark process on `database_url` (offline embedder)."""
    return Settings(_env_file=None, DATABASE_URL=database_url, data_dir=Path("/tmp"))  # type: ignore[call-arg]


async def ingest_eval(pool: Pool, settings: Settings, search: PostgresKnowledgeSearch) -> int:
    """Ingest the evaluation documents into the `eval` knowledge base; return its chunks."""
    service = KnowledgeService(pool, settings, ADMIN, search=search)
    await service.create({"name": "eval", "chunking": {"targetTokens": 300}})
    for doc in load_eval()["documents"]:
        await service.add_document(
            "eval", content=doc["text"].encode(), title=doc["title"], file_name="doc.md"
        )
    jobs = KnowledgeJobs(pool, search.embedders, settings)
    while await jobs.run_one():
        pass
    async with pool.connection() as conn:  # the statistics autovacuum would gather
        await conn.execute("ANALYZE kb_chunks")
    return int((await service.get("eval"))["chunks"])


async def quality(pool: Pool, search: PostgresKnowledgeSearch) -> dict[str, tuple[float, float]]:
    """Return recall@5 and MRR@10 of each search method on the evaluation questions."""
    questions = load_eval()["questions"]
    scores: dict[str, tuple[float, float]] = {}
    async with pool.connection() as conn:
        for method in METHODS:
            found, reciprocal = 0, 0.0
            for q in questions:
                query = KnowledgeQuery(q["question"], TENANT, knowledge_bases=["eval"], top_k=10)
                result = await search.search_on(conn, query, method=method)
                (want,) = q["relevant"]
                ranks = [
                    h.rank
                    for h in result.hits
                    if h.title == want["title"] and want["section"] in h.heading_path
                ]
                if ranks and ranks[0] <= 5:
                    found += 1
                if ranks:
                    reciprocal += 1 / ranks[0]
            scores[method] = (found / len(questions), reciprocal / len(questions))
    return scores


def sentences() -> list[str]:
    """The evaluation set's sentences, the material of the synthetic chunks."""
    out: list[str] = []
    for doc in load_eval()["documents"]:
        for line in doc["text"].splitlines():
            if line and not line.startswith("#"):
                out.extend(s for s in re.split(r"(?<=[.;])\s+", line) if len(s) > 30)
    return out


async def seed(pool: Pool, settings: Settings, name: str, count: int, rng: random.Random) -> float:
    """COPY `count` synthetic chunks (100 per document) into knowledge base `name`."""
    material = sentences()
    dims = settings.embedding_dims
    began = time.perf_counter()
    service = KnowledgeService(pool, settings, ADMIN)
    kb = (await service.create({"name": name}))["id"]
    async with pool.connection() as conn, conn.cursor() as cur:
        async with cur.copy(
            "COPY kb_documents (id, kb_id, tenant_id, title, media_type, content, content_hash,"
            " status) FROM STDIN"
        ) as copy:
            for d in range(count // 100):
                doc = f"doc_{name}_{d:07d}"
                await copy.write_row(
                    (doc, kb, TENANT, f"Manual {d}", "text/plain", b"-", doc, "ready")
                )
        async with cur.copy(
            "COPY kb_chunks (id, document_id, kb_id, tenant_id, position, text, tokens, label,"
            " dims, embedding) FROM STDIN"
        ) as copy:
            for i in range(count):
                text = " ".join(rng.sample(material, 3))
                vector = vector_literal(lexical_vector(text, dims))
                doc = f"doc_{name}_{i // 100:07d}"
                await copy.write_row(
                    (
                        f"chk_{name}_{i:08d}",
                        doc,
                        kb,
                        TENANT,
                        i % 100,
                        text,
                        len(text) // 4,
                        f"Manual {i // 100}",
                        dims,
                        vector,
                    )
                )
    async with pool.connection() as conn:
        await conn.execute("ANALYZE kb_chunks")
        await conn.execute("ANALYZE kb_documents")
    return time.perf_counter() - began


async def latency(
    pool: Pool, search: PostgresKnowledgeSearch, name: str, queries: int, method: Method = "hybrid"
) -> tuple[list[float], str]:
    """Time `queries` searches of knowledge base `name`; return them and the plan."""
    questions = [q["question"] for q in load_eval()["questions"]]
    timings = []
    async with pool.connection() as conn:
        for i in range(queries + 10):
            query = KnowledgeQuery(questions[i % len(questions)], TENANT, knowledge_bases=[name])
            began = time.perf_counter()
            await search.search_on(conn, query, method=method)
            if i >= 10:  # the first calls warm the caches
                timings.append(time.perf_counter() - began)
        cur = await conn.execute("SELECT id, dims FROM knowledge_bases WHERE name = %s", (name,))
        kb = await cur.fetchone()
        assert kb is not None
        vec = vector_literal(lexical_vector("climate of Norway", kb["dims"]))
        params: dict[str, Any] = {"text": "climate of Norway", "kbs": [kb["id"]]}
        params |= {
            "kbs0": [kb["id"]],
            "vec0": vec,
            "depth": 40,
            "names": 10,
            "limit": 5,
            "wv": 1,
            "wt": 1,
            "wn": 1,
        }
        params["probes"] = search.probes
        params |= text_params(await search.text_query(conn, "climate of Norway"), search.candidates)
        sql = hybrid_sql([(0, kb["dims"])], method=method, probes=search.probes)
        cur = await conn.execute("EXPLAIN " + sql, params)
        plan = "\n".join(str(r["QUERY PLAN"]) for r in await cur.fetchall())
    return timings, plan


async def cell_recall(pool: Pool, search: PostgresKnowledgeSearch, name: str) -> float:
    """Return the mean share of the exact vector list's 40 chunks the cell search finds."""
    exact = PostgresKnowledgeSearch(pool, search.embedders, probes=None)
    shares = []
    async with pool.connection() as conn:
        for q in load_eval()["questions"]:
            query = KnowledgeQuery(q["question"], TENANT, knowledge_bases=[name], top_k=40)
            want = {h.chunk_id for h in (await exact.search_on(conn, query, method="vector")).hits}
            got = {h.chunk_id for h in (await search.search_on(conn, query, method="vector")).hits}
            shares.append(len(want & got) / max(1, len(want)))
    return sum(shares) / len(shares)


async def train(pool: Pool, name: str) -> float:
    """Train the cells of knowledge base `name` as the ingestion jobs would; return seconds."""
    began = time.perf_counter()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM knowledge_bases WHERE name = %s", (name,))
        kb = await cur.fetchone()
        assert kb is not None
        await train_cells(conn, kb["id"])
    seconds = time.perf_counter() - began
    async with pool.connection() as conn:
        # Autovacuum would get here on its own; index-only scans need the visibility map.
        await conn.execute("VACUUM (ANALYZE) kb_chunks")
        await conn.execute("ANALYZE kb_cells")
    return seconds


def add_scale(figures: Figures, count: int, seconds: float, timings: list[float]) -> None:
    """Add one scale's latency line."""
    p95 = sorted(timings)[int(0.95 * (len(timings) - 1))]
    figures.add(
        f"- {count:,} chunks (seeded in {seconds:.0f} s): hybrid search (embed + fused "
        f"statement): {stat_line(timings)}; p95 under 30 ms: {met(p95 < 0.030)}"
    )


async def measure(database_url: str, quick: bool, figures: Figures) -> None:
    """Run the quality and latency measurements, adding their lines to `figures`."""
    settings = settings_for(database_url)
    async with open_pool(database_url, settings) as pool:
        await migrate(pool)
        search = await open_knowledge(pool, settings)
        chunks = await ingest_eval(pool, settings, search)
        scores = await quality(pool, search)
        kind = knowledge_index_kind(settings, database_url)
        figures.add(
            f"Evaluation set: {len(load_eval()['documents'])} documents, {chunks} chunks, "
            f"{len(load_eval()['questions'])} questions; offline embedder "
            f"({settings.embedding_dims} dims, halfvec); vector index: **{kind}**."
        )
        figures.add("")
        figures.add("| search | recall@5 | MRR@10 |")
        figures.add("|---|---|---|")
        for method in METHODS:
            recall, mrr = scores[method]
            figures.add(f"| {method} | {recall:.2f} | {mrr:.3f} |")
        figures.add("")
        for index, label in ((0, "recall@5"), (1, "MRR@10")):
            best = max(scores["vector"][index], scores["text"][index])
            figures.add(
                f"- hybrid beats vector-only and full-text-only on {label}: "
                f"{met(scores['hybrid'][index] > best)}"
            )
        rng = random.Random(42)
        plan = ""
        for count in (10_000,) if quick else (10_000, 100_000):
            name = f"scale{count}"
            seconds = await seed(pool, settings, name, count, rng)
            if kind == "ivf":
                trained = await train(pool, name)
                share = await cell_recall(pool, search, name)
                figures.add(
                    f"- {count:,} chunks: cells trained in {trained:.0f} s; the vector list "
                    f"(40 chunks, {search.probes} cells probed) holds {share:.0%} of the exact "
                    "scan's 40 on the evaluation questions"
                )
            # The word statistics as a running process holds them once its cache is renewed
            # (at most five minutes after the ANALYZE), not those of the evaluation set alone.
            search = replace(search)
            timings, plan = await latency(pool, search, name, 100 if quick else 300)
            add_scale(figures, count, seconds, timings)
            for method in ("vector", "text"):
                alone, _ = await latency(pool, search, name, 50 if quick else 100, method)
                figures.add(f"  - {method} list alone: {stat_line(alone)}")
        figures.add("")
        figures.add("The plan of the largest search:")
        figures.add("")
        figures.add("```")
        for line in plan.splitlines():
            figures.add(re.sub(r"'\[[^\]]*\]'", "'[query vector]'", line))
        figures.add("```")


def main(database_url: str, quick: bool) -> Figures:
    """Measure retrieval quality and hybrid search latency."""
    figures = Figures("Knowledge", "make bench (bench/knowledge.py)")
    run_async(measure(database_url, quick, figures), limit_s=3600)
    return figures


if __name__ == "__main__":
    from bench.common import database_url_for, embedded_postgres

    with embedded_postgres() as url:
        print(main(database_url_for(url, "bench_knowledge"), quick=True).markdown())
