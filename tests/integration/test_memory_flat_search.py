"""The flat memory search (no vector index): same answers as LangGraph's, in one narrow plan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from langgraph.store.base import SearchItem, SearchOp
from langgraph.store.postgres import AsyncPostgresStore

from nodes.embeddings.embedder import EmbeddingScope, embedding_scope
from server.db.pool import Pool
from server.memory.flat import FLAT_SEARCH, FlatMemoryStore
from server.memory.store import index_config, make_embedder, open_memory_store
from server.settings import Settings
from tools.memory.book import Memory, MemoryBook, RecallPolicy, namespace, new_id

pytestmark = pytest.mark.timeout(300)
TOPICS = ("dark mode", "metric units", "weekly report", "train travel", "green tea", "rust")


@pytest.fixture(scope="module")
async def flat(pool: Pool, settings: Settings) -> AsyncIterator[AsyncPostgresStore]:
    store = await open_memory_store(pool, make_embedder(settings, pool=pool), "flat")
    book = MemoryBook(store)
    for i in range(120):
        user = f"u{i % 3}" if i % 4 else None
        text = f"Prefers {TOPICS[i % 6]} and {TOPICS[(i * 5) % 6]} number {i}"
        await book.put(Memory(new_id(), "flatco", user, text, "preference"))
    async with pool.connection() as conn:
        await conn.execute("ANALYZE store")
        await conn.execute("VACUUM (ANALYZE) store_vectors")
    yield store


def ops(query: str, limit: int, offset: int = 0) -> list[SearchOp]:
    mine, shared = namespace("flatco", "user", "u1"), namespace("flatco", "tenant")
    return [
        SearchOp(mine, None, limit, offset, query),
        SearchOp(shared, None, limit, offset, query),
    ]


async def found(store: AsyncPostgresStore, batch: list[SearchOp]) -> list[list[SearchItem]]:
    return cast(list[list[SearchItem]], await store.abatch(batch))


def inner(items: list[SearchItem]) -> dict[Any, Any]:
    """The items scored between the first and the last (ties at a cut may fall either way)."""
    ends = {round(items[0].score or 0.0, 5), round(items[-1].score or 0.0, 5)} if items else set()
    return {(i.namespace, i.key): i.value for i in items if round(i.score or 0.0, 5) not in ends}


@pytest.mark.parametrize(("limit", "offset"), [(5, 0), (200, 0), (7, 3)])
async def test_flat_search_returns_what_langgraphs_exact_search_returns(
    pool: Pool, settings: Settings, flat: AsyncPostgresStore, limit: int, offset: int
) -> None:
    assert isinstance(flat, FlatMemoryStore)
    # LangGraph's own store on the same tables is the reference: its exact scan, no index.
    reference = AsyncPostgresStore(
        pool, index=index_config(make_embedder(settings, pool=pool), "flat")
    )
    for query in ("dark mode at work", "tea or travel", "number 17"):
        ours = await found(flat, ops(query, limit, offset))
        theirs = await found(reference, ops(query, limit, offset))
        assert len(ours) == 2
        for a, b in zip(ours, theirs, strict=True):
            assert [i.score for i in a] == pytest.approx([i.score for i in b], abs=1e-6)
            assert inner(a) == inner(b)
            if limit == 200:
                assert {(i.key, i.value["text"]) for i in a} == {
                    (i.key, i.value["text"]) for i in b
                }
        if limit == 200:  # candidates cover everything: every memory of both namespaces
            assert [len(a) for a in ours] == [30, 30]


async def test_filtered_and_prefix_searches_still_go_through_langgraph(
    flat: AsyncPostgresStore,
) -> None:
    [filtered, tenant_wide] = await found(
        flat,
        [
            SearchOp(namespace("flatco", "user", "u2"), {"kind": "preference"}, 3, 0, "rust"),
            SearchOp(("flatco",), None, 500, 0, "rust"),
        ],
    )
    assert len(filtered) == 3
    assert len(tenant_wide) == 120


async def test_the_flat_plan_reads_vectors_by_namespace_and_joins_the_store_for_the_top(
    pool: Pool, flat: AsyncPostgresStore
) -> None:
    vector = await flat.embeddings.aembed_query("dark mode")  # type: ignore[union-attr]
    prefixes = [
        ".".join(namespace("flatco", "user", "u1")),
        ".".join(namespace("flatco", "tenant")),
    ]
    async with pool.connection() as conn:
        # A few dozen rows: make the planner show the path it takes on large stores.
        await conn.execute("SET enable_seqscan = off")
        await conn.execute("SET enable_bitmapscan = off")
        cur = await conn.execute(
            "EXPLAIN " + FLAT_SEARCH,
            {"prefixes": prefixes, "limits": [5, 5], "vec": str(vector)},
        )
        plan = "\n".join(r["QUERY PLAN"] for r in await cur.fetchall())
        await conn.execute("RESET enable_seqscan")
        await conn.execute("RESET enable_bitmapscan")
    assert "Index Only Scan using store_vectors_prefix_cover" in plan, plan
    assert "Index Cond: (prefix = ns.prefix)" in plan, plan
    assert "store_pkey" in plan, plan
    # The store's rows are joined above the cut to the top rows, not carried through the sort.
    assert plan.index("Limit") < plan.index("store_vectors_prefix_cover"), plan
    assert plan.index("store_pkey") > plan.index("store_vectors_prefix_cover"), plan


async def test_recall_records_its_embedding_in_the_ledger_with_a_commit_that_stays_local(
    pool: Pool, flat: AsyncPostgresStore
) -> None:
    with embedding_scope(EmbeddingScope("flatco", "u1", None, "recall")):
        await MemoryBook(flat).recall("flatco", "u1", "green tea please", RecallPolicy())
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant_id, user_id, run_id, purpose, model_id, inputs, input_tokens, cost,"
            " status, attempts, latency_ms FROM embedding_calls WHERE purpose = 'recall'"
        )
        rows = await cur.fetchall()
        # The relaxed commit is the ledger statement's own, not the pooled connection's.
        cur = await conn.execute("SHOW synchronous_commit")
        assert (await cur.fetchone())["synchronous_commit"] == "on"
    assert len(rows) == 1
    row = rows[0]
    assert (row["tenant_id"], row["user_id"], row["run_id"]) == ("flatco", "u1", None)
    assert (row["model_id"], row["inputs"], row["status"], row["attempts"]) == (
        "lexical:v1",
        1,
        "ok",
        1,
    )
    assert row["input_tokens"] > 0 and row["latency_ms"] >= 0
