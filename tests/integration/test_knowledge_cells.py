"""Vector search by cells (IVF in plain SQL): same answers as the exact scan, its plan, upkeep."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from nodes.embeddings.lexical import lexical_vector
from server.auth import Principal
from server.db.pool import Pool
from server.knowledge import cells
from server.knowledge.search import PostgresKnowledgeSearch, hybrid_sql, text_params, vector_literal
from server.knowledge.service import KnowledgeService
from server.knowledge.setup import open_knowledge
from server.knowledge.terms import TextQuery
from server.settings import Settings
from tools.knowledge.search import KnowledgeQuery

pytestmark = pytest.mark.timeout(300)
ADMIN = Principal("cellco", "ann", frozenset({"admin"}))
WORDS = [
    "reactor",
    "cooling",
    "pump",
    "valve",
    "turbine",
    "steam",
    "pressure",
    "alarm",
    "shift",
    "manual",
    "audit",
    "filter",
    "coffee",
    "train",
    "hotel",
    "invoice",
    "budget",
    "meeting",
    "python",
    "backup",
    "deploy",
    "rust",
    "garden",
    "bicycle",
]
QUERIES = ("cooling pump pressure", "hotel invoice budget", "python deploy backup", "garden")


async def add_chunks(pool: Pool, settings: Settings, name: str, count: int, seed: int) -> str:
    """Create knowledge base `name` with `count` chunks of random words; return its id."""
    service = KnowledgeService(pool, settings, ADMIN)
    kb = (await service.create({"name": name}))["id"]
    rng = random.Random(seed)
    doc = f"doc_{name}"
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO kb_documents (id, kb_id, tenant_id, title, media_type, content,"
            " content_hash, status) VALUES (%s, %s, 'cellco', %s, 'text/plain', '-', %s, 'ready')",
            (doc, kb, name, doc),
        )
        await more_chunks(pool, settings, kb, doc, range(count), rng)
    return str(kb)


async def more_chunks(
    pool: Pool, settings: Settings, kb: str, doc: str, positions: range, rng: random.Random
) -> None:
    rows = []
    for i in positions:
        text = " ".join(rng.sample(WORDS, 4)) + f" item {i}"
        vec = vector_literal(lexical_vector(text, settings.embedding_dims))
        rows.append((f"chk_{doc}_{i:05d}", doc, kb, i, text, text, settings.embedding_dims, vec))
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO kb_chunks (id, document_id, kb_id, tenant_id, position, text, tokens,"
            " label, dims, embedding) VALUES (%s, %s, %s, 'cellco', %s, %s, 10, %s, %s,"
            " %s::halfvec)",
            rows,
        )


@pytest.fixture(scope="module")
async def search(pool: Pool, settings: Settings) -> PostgresKnowledgeSearch:
    return await open_knowledge(pool, settings.model_copy(update={"knowledge_index": "ivf"}))


async def vector_ids(
    search: PostgresKnowledgeSearch, name: str, text: str, top_k: int
) -> list[str]:
    query = KnowledgeQuery(text, "cellco", knowledge_bases=[name], top_k=top_k)
    result = await search.search(query, method="vector")
    return [h.chunk_id for h in result.hits]


async def exact_ids(pool: Pool, settings: Settings, kb: str, text: str, top_k: int) -> list[str]:
    """The exact scan of every chunk, equal distances in id order (as the cell search)."""
    vec = vector_literal(lexical_vector(text, settings.embedding_dims))
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM kb_chunks WHERE kb_id = %s ORDER BY embedding <=> %s::halfvec, id"
            " LIMIT %s",
            (kb, vec, top_k),
        )
        return [r["id"] for r in await cur.fetchall()]


async def test_cells_give_the_exact_scans_answers_when_the_probes_cover_every_cell(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    assert search.probes == cells.PROBES
    kb = await add_chunks(pool, settings, "covered", 300, seed=1)
    truth = {q: await exact_ids(pool, settings, kb, q, 30) for q in QUERIES}
    # Untrained: every chunk is scanned exactly through the cell-less arm.
    for q in QUERIES:
        assert await vector_ids(search, "covered", q, 30) == truth[q]
    async with pool.connection() as conn:
        assert await cells.train_cells(conn, kb, cells=6) == 6
        cur = await conn.execute(
            "SELECT count(DISTINCT cell) AS cells, count(*) FILTER (WHERE cell IS NULL) AS loose"
            " FROM kb_chunks WHERE kb_id = %s",
            (kb,),
        )
        row = await cur.fetchone()
    assert row is not None and row["loose"] == 0 and row["cells"] > 1
    wide = PostgresKnowledgeSearch(pool, search.embedders, probes=6)
    for q in QUERIES:
        assert await vector_ids(wide, "covered", q, 30) == truth[q]
    # With one cell probed, only that cell's chunks can come back.
    narrow = PostgresKnowledgeSearch(pool, search.embedders, probes=1, depth=300)
    found = await vector_ids(narrow, "covered", QUERIES[0], 300)
    assert 0 < len(found) < 300


async def test_chunks_stored_after_training_get_their_nearest_cell_and_are_found(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    kb = await add_chunks(pool, settings, "growing", 200, seed=2)
    async with pool.connection() as conn:
        await cells.train_cells(conn, kb, cells=5)
    await more_chunks(pool, settings, kb, "doc_growing", range(200, 220), random.Random(3))
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT c.cell, (SELECT k.cell FROM kb_cells k WHERE k.kb_id = c.kb_id"
            " ORDER BY k.centroid <=> c.embedding LIMIT 1) AS nearest FROM kb_chunks c"
            " WHERE c.kb_id = %s AND c.position >= 200",
            (kb,),
        )
        rows = await cur.fetchall()
    assert len(rows) == 20 and all(r["cell"] == r["nearest"] for r in rows)
    wide = PostgresKnowledgeSearch(pool, search.embedders, probes=5, depth=220)
    found = set(await vector_ids(wide, "growing", "item 207", 220))
    assert "chk_doc_growing_00207" in found


async def test_cells_are_trained_past_the_minimum_and_again_after_the_base_doubles(
    pool: Pool, settings: Settings
) -> None:
    kb = await add_chunks(pool, settings, "upkeep", cells.MIN_CHUNKS - 1, seed=4)
    assert not await cells.maintain_cells(pool, kb)
    await more_chunks(
        pool,
        settings,
        kb,
        "doc_upkeep",
        range(cells.MIN_CHUNKS - 1, cells.MIN_CHUNKS),
        random.Random(5),
    )
    assert await cells.maintain_cells(pool, kb)
    assert not await cells.maintain_cells(pool, kb)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT cells, chunks FROM kb_cell_trainings WHERE kb_id = %s", (kb,)
        )
        row = await cur.fetchone()
    assert row is not None
    assert (row["cells"], row["chunks"]) == (cells.cell_count(cells.MIN_CHUNKS), cells.MIN_CHUNKS)


async def test_the_vector_list_reads_the_nearest_cells_through_the_covering_index(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    kb = await add_chunks(pool, settings, "planned", 400, seed=6)
    async with pool.connection() as conn:
        await cells.train_cells(conn, kb, cells=8)
        await conn.execute("VACUUM (ANALYZE) kb_chunks")
        await conn.execute("ANALYZE kb_cells")
        vec = vector_literal(lexical_vector("cooling pump", settings.embedding_dims))
        params = {"text": "cooling pump", "kbs": [kb], "kbs0": [kb], "vec0": vec, "depth": 40}
        params |= {"names": 10, "limit": 5, "wv": 1, "wt": 1, "wn": 1, "probes": 2}
        params |= text_params(TextQuery(("cool", "pump"), ("pump",), all_needed=False), 500)
        sql = hybrid_sql([(0, settings.embedding_dims)], method="vector", probes=2)
        await conn.execute("SET enable_seqscan = off")
        await conn.execute("SET enable_bitmapscan = off")
        cur = await conn.execute("EXPLAIN " + sql, params)
        plan = "\n".join(str(next(iter(r.values()))) for r in await cur.fetchall())
        await conn.execute("RESET enable_seqscan")
        await conn.execute("RESET enable_bitmapscan")
    assert "kb_cells" in plan, plan
    assert "Index Only Scan using kb_chunks_cell" in plan, plan
    assert "Index Cond: ((kb_id = b.kb_id) AND (cell = ANY (" in plan, plan


async def test_a_word_in_most_chunks_does_not_select_full_text_candidates_on_its_own(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    # Every chunk says "item"; only chunk 7 has the token "7".
    await add_chunks(pool, settings, "commonword", 300, seed=9)
    async with pool.connection() as conn:
        await conn.execute("ANALYZE kb_chunks")  # the statistics autovacuum would gather
    # A search reads the statistics once and keeps them for minutes: a fresh one sees these.
    search = replace(search)
    query = KnowledgeQuery("item 7", "cellco", knowledge_bases=["commonword"], top_k=10)
    pruned = await search.search(query, method="text")
    assert [h.chunk_id for h in pruned.hits] == ["chk_doc_commonword_00007"]
    # With no word counted as common and no budget, every chunk saying "item" is a candidate.
    everything = replace(search, common=1.0, candidates=10_000)
    found = await everything.search(query, method="text")
    assert len(found.hits) == 10 and found.hits[0].chunk_id == "chk_doc_commonword_00007"
    # A query of common words only still finds what has them all.
    only_common = KnowledgeQuery("item", "cellco", knowledge_bases=["commonword"], top_k=10)
    assert len((await search.search(only_common, method="text")).hits) == 10
