"""The analysts' surface: the example queries of docs/memory.md run, and the read-only role."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from langgraph.store.postgres import AsyncPostgresStore
from psycopg.conninfo import make_conninfo

from nodes.embeddings.embedder import EmbeddingScope, embedding_scope
from server.db.pool import Pool
from server.memory.analysts import create_analyst_role
from server.memory.store import index_kind, make_embedder, open_memory_store
from server.settings import Settings
from tools.memory.book import Memory, MemoryBook, new_id

pytestmark = pytest.mark.timeout(300)
DOC = Path(__file__).resolve().parents[2] / "docs" / "memory.md"
SEED = [
    ("acme", "ann", "Prefers dark mode in every editor", "preference"),
    ("acme", "bob", "Prefers dark mode in the terminal", "preference"),
    ("acme", "cy", "Prefers short answers without small talk", "preference"),
    ("acme", None, "Acme's fiscal year starts in April", "fact"),
    ("globex", "ann", "Prefers dark mode on the phone", "preference"),
    ("globex", "dan", "Works on the reactor cooling project", "fact"),
]


@pytest.fixture(scope="module")
async def store(pool: Pool, settings: Settings) -> AsyncIterator[AsyncPostgresStore]:
    store = await open_memory_store(pool, make_embedder(settings, pool=pool), index_kind(settings))
    book = MemoryBook(store)
    for tenant, user, text, kind in SEED:
        with embedding_scope(EmbeddingScope(tenant, user, None, "api")):
            await book.put(
                Memory(new_id(), tenant, user, text, kind, source_run_id=f"run_{tenant}")
            )
    yield store


def doc_queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


async def test_every_example_query_in_the_docs_runs_and_answers(
    pool: Pool, store: AsyncPostgresStore
) -> None:
    queries = doc_queries()
    assert len(queries) >= 4
    async with pool.connection() as conn:
        answers = []
        for query in queries:
            cur = await conn.execute(query.replace("%", "%%"))
            answers.append(await cur.fetchall())
    nearest, clusters, by_run, cost = answers[:4]
    assert nearest[0]["text"] == "Prefers dark mode in every editor"
    assert [r["text"] for r in nearest[1:3]] == [
        "Prefers dark mode in the terminal",
        "Prefers dark mode on the phone",
    ] or {r["text"] for r in nearest[1:3]} == {
        "Prefers dark mode in the terminal",
        "Prefers dark mode on the phone",
    }
    assert {r["tenant_id"] for r in clusters} == {"acme"}
    assert {r["source_run_id"] for r in by_run} == {"run_acme", "run_globex"}
    assert {r["tenant_id"] for r in cost} >= {"acme", "globex"}


async def test_the_analyst_role_reads_the_views_and_nothing_else(
    pool: Pool, store: AsyncPostgresStore, database_url: str
) -> None:
    password = await create_analyst_role(pool, "test_analyst", None)
    url = make_conninfo(database_url, user="test_analyst", password=password)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM analytics_memories")
        assert (await cur.fetchone()) == (len(SEED),)
        for forbidden in ("SELECT * FROM store", "SELECT * FROM runs", "SELECT * FROM api_keys"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(forbidden)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            await conn.execute("CREATE TABLE analyst_scratch (x int)")
    # Running it again resets the password instead of failing.
    assert await create_analyst_role(pool, "test_analyst", "fixed-pw") == "fixed-pw"
