"""The memory store on real Postgres: recall ranks and floors, tenants and users apart, HNSW."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from langgraph.store.postgres import AsyncPostgresStore

from server.db.pool import Pool
from server.memory.flat import FLAT_SEARCH, FlatMemoryStore
from server.memory.store import (
    index_config,
    index_kind,
    make_embedder,
    open_memory_store,
    prune_expired_memories,
)
from server.settings import Settings
from tools.memory.book import Memory, MemoryBook, RecallPolicy, namespace, new_id

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
async def store(pool: Pool, settings: Settings) -> AsyncIterator[AsyncPostgresStore]:
    yield await open_memory_store(pool, make_embedder(settings, pool=pool), index_kind(settings))


def memory(tenant: str, user: str | None, text: str, kind: str = "fact") -> Memory:
    return Memory(id=new_id(), tenant_id=tenant, user_id=user, text=text, kind=kind)


async def test_recall_finds_the_users_preference_and_never_another_tenants_or_users(
    store: AsyncPostgresStore,
) -> None:
    book = MemoryBook(store)
    mine = await book.put(memory("acme", "ann", "Prefers dark mode in every editor", "preference"))
    await book.put(memory("acme", "bob", "Prefers dark mode in the terminal", "preference"))
    await book.put(memory("globex", "ann", "Prefers dark mode on the phone", "preference"))
    shared = await book.put(memory("acme", None, "Acme's editors are configured centrally"))
    await book.put(memory("acme", "ann", "Has a cat called Tom"))

    found = await book.recall("acme", "ann", "dark mode for my editors?", RecallPolicy())
    ids = [m.id for m in found]
    assert ids[0] == mine.id
    assert shared.id in ids
    assert all(m.tenant_id == "acme" and m.user_id in ("ann", None) for m in found)
    assert all(m.score is not None and m.similarity is not None for m in found)
    # The floor leaves unrelated memories out.
    strict = await book.recall("acme", "ann", "dark mode editor", RecallPolicy(min_similarity=0.5))
    assert [m.id for m in strict] == [mine.id]


async def test_expired_memories_are_not_recalled_and_deleted_ones_are_gone(
    store: AsyncPostgresStore,
) -> None:
    book = MemoryBook(store)
    past = datetime.now(UTC) - timedelta(days=1)
    old = await book.put(
        Memory(new_id(), "initech", "pat", "Works on the TPS reports", expires_at=past)
    )
    kept = await book.put(memory("initech", "pat", "Works on the TPS report cover sheets"))
    found = await book.recall("initech", "pat", "TPS reports", RecallPolicy())
    assert [m.id for m in found] == [kept.id]
    await book.delete(kept)
    assert await book.get("initech", "pat", kept.id) is None
    assert await book.get("initech", "pat", old.id) is not None


async def test_pruning_deletes_expired_memories_with_their_vectors_and_nothing_else(
    pool: Pool, store: AsyncPostgresStore
) -> None:
    book = MemoryBook(store)
    past, future = datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC) + timedelta(days=1)
    gone = await book.put(Memory(new_id(), "hooli", "gav", "Likes tethering", expires_at=past))
    later = await book.put(Memory(new_id(), "hooli", "gav", "Owns a box", expires_at=future))
    forever = await book.put(memory("hooli", None, "Hooli's motto is making the world better"))

    assert await prune_expired_memories(pool, batch=1) >= 1
    assert await book.get("hooli", "gav", gone.id) is None
    assert await book.get("hooli", "gav", later.id) == later
    assert await book.get("hooli", None, forever.id) == forever
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM store_vectors WHERE key = %s", (gone.id,)
        )
        assert (await cur.fetchone())["n"] == 0
    assert await prune_expired_memories(pool) == 0


async def test_ids_with_dots_are_kept_apart(store: AsyncPostgresStore) -> None:
    book = MemoryBook(store)
    item = await book.put(memory("a.b", "c.d", "Speaks Portuguese"))
    assert (await book.get("a.b", "c.d", item.id)) == item
    assert await book.search("a", user_id="b.c.d") == []
    assert [m.id for m in await book.search("a.b", user_id="c.d")] == [item.id]


async def test_langgraphs_search_query_uses_the_hnsw_index(
    pool: Pool, store: AsyncPostgresStore, settings: Settings
) -> None:
    # The searches recall's exact statement leaves to LangGraph (filtered, tenant-wide).
    if index_kind(settings) != "hnsw":
        pytest.skip("this CPU cannot run the embedded pgvector's HNSW (needs AVX-512)")
    book = MemoryBook(store)
    for i in range(300):
        await book.put(memory("bigco", f"u{i % 7}", f"Memory number {i} about topic {i % 13}"))
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("ANALYZE store")
        await conn.execute("ANALYZE store_vectors")
        # 300 rows fit in a few pages, where reading one user's rows and sorting them costs
        # less than any vector index. The plan must show that the index serves the query's
        # order (its operator and types match), as it will once the table is large.
        for plan in ("seqscan", "bitmapscan", "sort"):
            await conn.execute(f"SET LOCAL enable_{plan} = off")
        vector = await store.embeddings.aembed_query("topic 5")  # type: ignore[union-attr]
        cur = await conn.execute(
            "EXPLAIN SELECT s.key FROM store s JOIN store_vectors sv"
            " ON s.prefix = sv.prefix AND s.key = sv.key"
            " WHERE s.prefix = %s ORDER BY sv.embedding <=> %s::halfvec LIMIT 25",
            ("bigco.users.u3.memories", str(vector)),
        )
        plan = "\n".join(r["QUERY PLAN"] for r in await cur.fetchall())
    assert "store_vectors_embedding_idx" in plan, plan


async def test_recall_is_exact_and_reads_one_namespace_with_or_without_the_hnsw_index(
    pool: Pool, store: AsyncPostgresStore, settings: Settings
) -> None:
    # With the HNSW index an unfiltered search of one user's memories walked the index and
    # dropped the other users' neighbours: 84 ms at the median for 100 users' 100,000.
    assert isinstance(store, FlatMemoryStore)
    book = MemoryBook(store)
    for i in range(240):
        await book.put(memory("exactco", f"u{i % 8}", f"Memory number {i} about topic {i % 11}"))
    async with pool.connection() as conn:
        await conn.execute("VACUUM (ANALYZE) store_vectors")
    reference = AsyncPostgresStore(
        pool, index=index_config(make_embedder(settings, pool=pool), "flat")
    )  # LangGraph's exact scan of the same rows
    mine = namespace("exactco", "user", "u3")
    for query in ("topic 5", "memory number 100", "something else entirely"):
        ours = await store.asearch(mine, query=query, limit=10)
        theirs = await reference.asearch(mine, query=query, limit=10)
        assert [round(i.score or 0.0, 5) for i in ours] == [
            round(i.score or 0.0, 5) for i in theirs
        ]
        assert len(ours) == 10
    vector = await store.embeddings.aembed_query("topic 5")  # type: ignore[union-attr]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "EXPLAIN " + FLAT_SEARCH,
            {"prefixes": [".".join(mine)], "limits": [10], "vec": str(vector)},
        )
        plan = "\n".join(r["QUERY PLAN"] for r in await cur.fetchall())
    assert "store_vectors_embedding_idx" not in plan, plan


async def test_pooled_connections_plan_no_parallel_scans_and_complete_filtered_hnsw_searches(
    pool: Pool,
) -> None:
    # A parallel plan made recall scan every stored memory instead of one user's (see the pool).
    async with pool.connection() as conn:
        cur = await conn.execute("SHOW max_parallel_workers_per_gather")
        assert (await cur.fetchone())["max_parallel_workers_per_gather"] == "0"
        # And a filtered HNSW search keeps scanning until it has enough rows.
        cur = await conn.execute("SHOW hnsw.iterative_scan")
        assert (await cur.fetchone())["hnsw.iterative_scan"] == "strict_order"
