"""The search statement's plans: cells at `ivf`, full-text tiers, planned with its values."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bench import knowledge as knowledge_bench
from nodes.embeddings.lexical import lexical_vector
from server.auth import Principal
from server.db.pool import Pool
from server.knowledge import cells
from server.knowledge.search import PostgresKnowledgeSearch, hybrid_sql, text_params, vector_literal
from server.knowledge.service import KnowledgeService
from server.knowledge.setup import open_knowledge
from server.settings import Settings
from tools.knowledge.search import KnowledgeQuery

pytestmark = pytest.mark.timeout(300)
TENANT = "planco"
ADMIN = Principal(TENANT, "ann", frozenset({"admin"}))
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
    "audit",
    "filter",
    "coffee",
]


@pytest.fixture(scope="module")
async def search(pool: Pool, settings: Settings) -> PostgresKnowledgeSearch:
    return await open_knowledge(pool, settings.model_copy(update={"knowledge_index": "ivf"}))


async def add_base(pool: Pool, settings: Settings, name: str, texts: list[str]) -> str:
    """Create knowledge base `name` with a chunk per text, 100 to a document; return its id."""
    kb = str((await KnowledgeService(pool, settings, ADMIN).create({"name": name}))["id"])
    dims = settings.embedding_dims
    docs = [
        (f"doc_{name}_{d}", kb, TENANT, f"Plant notes {d}", f"doc_{name}_{d}")
        for d in range(len(texts) // 100 + 1)
    ]
    rows = [
        (
            f"chk_{name}_{i:05d}",
            f"doc_{name}_{i // 100}",
            kb,
            i % 100,
            t,
            dims,
            vector_literal(lexical_vector(t, dims)),
        )
        for i, t in enumerate(texts)
    ]
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO kb_documents (id, kb_id, tenant_id, title, media_type, content,"
            " content_hash, status) VALUES (%s, %s, %s, %s, 'text/plain', '-', %s, 'ready')",
            docs,
        )
        await cur.executemany(
            "INSERT INTO kb_chunks (id, document_id, kb_id, tenant_id, position, text, tokens,"
            f" label, dims, embedding) VALUES (%s, %s, %s, '{TENANT}', %s, %s, 10, '', %s,"
            " %s::halfvec)",
            rows,
        )
    return kb


async def test_the_hybrid_statement_reads_cells_and_gin_and_no_statistics(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    rng = random.Random(3)
    texts = [" ".join(rng.sample(WORDS, 4)) + f" item {i} tag{i % 97}" for i in range(3_000)]
    kb = await add_base(pool, settings, "planned", texts)
    async with pool.connection() as conn:
        await cells.train_cells(conn, kb, cells=30)
        await conn.execute("VACUUM (ANALYZE) kb_chunks")
        await conn.execute("ANALYZE kb_cells")
        # Statistics for the titles too, so that the plan does not depend on whether
        # autovacuum has analysed them yet (a few dozen titles: a scan may beat the index).
        await conn.execute("ANALYZE kb_title_trigrams")
        await conn.execute("ANALYZE kb_documents")
        fresh = replace(search)  # reads the statistics just gathered
        text = "cooling pump tag5 tag7 item 12"
        vec = vector_literal(lexical_vector(text, settings.embedding_dims))
        params = {"text": text, "kbs": [kb], "kbs0": [kb], "vec0": vec, "depth": 40}
        params |= {"names": 10, "limit": 5, "wv": 1, "wt": 1, "wn": 1, "probes": 4}
        params |= text_params(await fresh.text_query(conn, text), fresh.candidates)
        sql = hybrid_sql([(0, settings.embedding_dims)], method="hybrid", probes=4)
        cur = await conn.execute("EXPLAIN " + sql, params)
        plan = "\n".join(str(next(iter(r.values()))) for r in await cur.fetchall())
    # Vectors: the probed cells' chunks in one index-only scan of the covering index.
    assert "Index Only Scan using kb_chunks_cell" in plan, plan
    assert "Index Cond: ((kb_id = b.kb_id) AND (cell = ANY (" in plan, plan
    # Full text: every tier through the GIN index, the pairs as one scan per pair.
    assert plan.count("Bitmap Index Scan on kb_chunks_tsv") >= 3, plan
    assert "tsv @@ ANY (" in plan, plan
    assert "Seq Scan on kb_chunks" not in plan, plan
    # The word statistics come from the search's cache, not from the catalog per statement.
    assert "pg_statistic" not in plan, plan
    # Titles: candidates from their kept trigrams, not `word_similarity` on every title. With
    # this base's few titles the planner may scan the trigram table rather than its index.
    assert "on kb_title_trigrams" in plan, plan
    assert "(trigram = ANY (" in plan, plan


async def test_full_text_candidates_widen_from_every_word_to_pairs_to_single_words(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    filler = [f"coffee filter audit note {i}" for i in range(40)]
    texts = ["alpha beta gamma", "alpha beta", "beta gamma", "gamma", "alpha", *filler]
    await add_base(pool, settings, "tiers", texts)
    query = KnowledgeQuery("alpha beta gamma", TENANT, knowledge_bases=["tiers"], top_k=10)
    found = [h.chunk_id for h in (await search.search(query, method="text")).hits]
    assert found[0] == "chk_tiers_00000"
    assert set(found[1:3]) == {"chk_tiers_00001", "chk_tiers_00002"}
    assert set(found[3:]) == {"chk_tiers_00003", "chk_tiers_00004"}
    # Enough chunks with every word: the others are not candidates, nor ranked.
    narrow = replace(search, depth=1)
    hits = (await narrow.search(query, method="text")).hits
    assert [h.chunk_id for h in hits] == ["chk_tiers_00000"]
    # Each tier ranks at most `candidates` chunks: 40 say "coffee", two are ranked.
    capped = replace(search, candidates=2)
    coffee = KnowledgeQuery("coffee", TENANT, knowledge_bases=["tiers"], top_k=10)
    assert len((await capped.search(coffee, method="text")).hits) == 2
    assert len((await search.search(coffee, method="text")).hits) == 10


async def test_a_query_word_with_quotes_and_operators_is_searched_as_a_word(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    await add_base(pool, settings, "quoted", ["o'brien's pump | valve & alarm", "steam"])
    query = KnowledgeQuery("o'brien | & !", TENANT, knowledge_bases=["quoted"], top_k=5)
    hits = (await search.search(query, method="text")).hits
    assert [h.chunk_id for h in hits] == ["chk_quoted_00000"]


async def test_a_title_is_found_through_its_kept_trigrams_typos_included(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    texts = [f"{w} note {i}" for i, w in enumerate(WORDS * 25)]
    kb = await add_base(pool, settings, "titled", texts)
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE kb_documents SET title = 'Reykjavik harbour' WHERE id = 'doc_titled_1'"
        )
        cur = await conn.execute(
            "SELECT document_id, count(*) AS n FROM kb_title_trigrams WHERE kb_id = %s"
            " GROUP BY document_id ORDER BY document_id",
            (kb,),
        )
        kept = {r["document_id"]: r["n"] for r in await cur.fetchall()}
    # One row per kept trigram of each title, renewed when the title changes: "Plant notes 0"
    # has 14 trigrams and keeps 14 - 8 + 2; "Reykjavik harbour" 18, keeps 18 - 10 + 2.
    assert kept["doc_titled_0"] == 8
    assert kept["doc_titled_1"] == 10
    for text in ("harbour of reykjavk", "what about the reykjavik harbor?"):
        query = KnowledgeQuery(text, TENANT, knowledge_bases=["titled"], top_k=3)
        hits = (await search.search(query)).hits
        assert hits and hits[0].document_id == "doc_titled_1", text
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM kb_documents WHERE id = 'doc_titled_1'")
        cur = await conn.execute(
            "SELECT count(*) AS n FROM kb_title_trigrams WHERE document_id = 'doc_titled_1'"
        )
        assert (await cur.fetchone() or {})["n"] == 0


async def test_every_title_a_question_nearly_holds_shares_two_kept_trigrams_with_it(
    pool: Pool,
) -> None:
    # The title list's candidates (two kept trigrams shared) never miss a title
    # `word_similarity` would keep.
    rng = random.Random(5)
    words = [*WORDS, "norway", "climate", "manual", "42", "x", "ab", "Reykjavik"]
    titles = [" ".join(rng.sample(words, rng.randint(1, 3))) for _ in range(150)]
    titles += [t[: rng.randint(1, len(t))] for t in titles[:50]]
    questions = [" ".join(rng.sample(words, rng.randint(2, 6))) for _ in range(150)]
    questions += [q.replace("o", "0", 1).replace("a", "e", 1) for q in questions[:50]]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE word_similarity(t, q) >= 0.6) AS kept,"
            " count(*) FILTER (WHERE word_similarity(t, q) >= 0.6"
            " AND (SELECT count(*) FROM unnest(agentrt_kb_title_trigrams(t)) AS k"
            "      WHERE k = ANY(show_trgm(q))) < 2) AS missed"
            " FROM unnest(%s::text[]) AS t, unnest(%s::text[]) AS q",
            (titles, questions),
        )
        row = await cur.fetchone()
    assert row is not None and row["kept"] > 100
    assert row["missed"] == 0


async def test_a_question_sharing_one_trigram_with_every_title_checks_none_of_them(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    # "Germany" holds "man", which every "Manual N" keeps: with one shared trigram enough,
    # `word_similarity` ran on every title of the base (10,000 at a million chunks: 53 ms).
    kb = await add_base(pool, settings, "manuals", [f"{w} valve note" for w in WORDS])
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO kb_documents (id, kb_id, tenant_id, title, media_type, content,"
            " content_hash, status) VALUES (%s, %s, %s, %s, 'text/plain', '-', %s, 'ready')",
            [(f"doc_man_{i}", kb, TENANT, f"Manual {i}", f"doc_man_{i}") for i in range(300)],
        )

    async def similarity_calls(text: str) -> int:
        query = KnowledgeQuery(text, TENANT, knowledge_bases=["manuals"], top_k=3)
        async with pool.connection() as conn, conn.transaction():
            await conn.execute("SET LOCAL track_functions = 'all'")
            await search.search_on(conn, query)
            cur = await conn.execute(
                "SELECT coalesce(sum(calls), 0) AS n FROM pg_stat_xact_user_functions"
                " WHERE funcname = 'word_similarity'"
            )
            return int((await cur.fetchone() or {})["n"])

    assert await similarity_calls("What is the terrain of Germany like?") == 0
    # A question holding a title's word still has those titles checked.
    assert await similarity_calls("the manual of the valve") >= 300


async def test_the_statement_is_planned_with_its_values_and_the_session_keeps_its_mode(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    await add_base(pool, settings, "custom", [f"{w} pump note {i}" for i, w in enumerate(WORDS)])
    query = KnowledgeQuery("cooling pump", TENANT, knowledge_bases=["custom"], top_k=3)
    async with pool.connection() as conn:
        first = await search.search_on(conn, query)
        for _ in range(7):  # `auto` would weigh a generic plan after the fifth
            again = await search.search_on(conn, query)
            assert [h.chunk_id for h in again.hits] == [h.chunk_id for h in first.hits]
        cur = await conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%WITH t1 AS%%' AND statement NOT LIKE '%%pg_prepared%%'"
        )
        plans = await cur.fetchall()
        mode = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
    # Other tests' searches may have used this connection: every statement of theirs too.
    assert plans and all(p["generic_plans"] == 0 for p in plans)
    assert max(p["custom_plans"] for p in plans) >= 8
    assert mode is not None and mode["plan_cache_mode"] == "auto"


async def test_a_full_text_search_of_a_fresh_base_reads_its_candidates_not_the_base(
    pool: Pool, settings: Settings, search: PostgresKnowledgeSearch
) -> None:
    # A base just loaded and analysed, not yet vacuumed, as after an ingestion. Planned
    # without its values, the tier of word pairs walked the base's `kb_id` index and read
    # every chunk, because a generic plan expects a `LIMIT` to stop such a walk early; the
    # question's pairs are rare, so it never did (100,000 chunks: 154 ms against 11 ms).
    await knowledge_bench.seed(pool, settings, "freshtext", 10_000, random.Random(11))
    fresh = replace(search)  # reads the statistics just gathered
    question = "What is the climate of Norway like in winter?"
    query = KnowledgeQuery(question, knowledge_bench.TENANT, knowledge_bases=["freshtext"])
    async with pool.connection() as conn:
        # One connection, past the five executions after which `auto` may pick a generic plan.
        for _ in range(6):
            async with conn.transaction():
                hits = await fresh.search_on(conn, query, method="text")
                cur = await conn.execute(
                    "SELECT pg_stat_get_xact_tuples_fetched('kb_chunks'::regclass)"
                    " + pg_stat_get_xact_tuples_returned('kb_chunks'::regclass) AS read"
                )
                row = await cur.fetchone()
            assert hits.hits
            # Three tiers of at most `candidates` chunks each, and the best `depth` again.
            assert row is not None and row["read"] <= 3 * fresh.candidates + fresh.depth, row
