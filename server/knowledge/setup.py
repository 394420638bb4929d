"""A process's knowledge search: embedders, the vector index choice, the optional reranker.

The chunks' vectors are `halfvec` without a fixed size (each knowledge base has its own
model), so the HNSW index is one partial expression index per vector size, created here for
the sizes in use when the index kind is `hnsw` (docs/knowledge.md, docs/decisions/1401).
"""

from __future__ import annotations

import logging

from nodes.models.usage import Pricer
from server.db.pool import Pool, migration_lock
from server.knowledge.cells import PROBES, ensure_cell_index
from server.knowledge.rerank import CrossEncoderReranker
from server.knowledge.search import Embedders, PostgresKnowledgeSearch
from server.memory.store import _local as is_local
from server.memory.store import embedded_pgvector_runs_here
from server.observability.tracing import Tracing
from server.settings import Settings

log = logging.getLogger(__name__)


def knowledge_index_kind(settings: Settings, url: str | None = None) -> str:
    """Return `hnsw`, `ivf` or `flat` for the chunks' vectors.

    `auto` is HNSW unless pgvector cannot run it here (as the memory store decides), then the
    cells of server/knowledge/cells.py.
    """
    if settings.knowledge_index != "auto":
        return settings.knowledge_index
    if is_local(url or settings.database_url) and not embedded_pgvector_runs_here():
        log.warning(
            "knowledge: vector search by cells (IVF), no HNSW index: the embedded Postgres's "
            "pgvector needs AVX-512, which this CPU lacks (AGENTRT_KNOWLEDGE_INDEX=hnsw overrides)"
        )
        return "ivf"
    return "hnsw"


def hnsw_index_sql(dims: int) -> str:
    """Return the HNSW index of the chunks whose vectors have `dims` numbers."""
    return (
        f"CREATE INDEX IF NOT EXISTS kb_chunks_hnsw_{dims} ON kb_chunks USING hnsw "
        f"((embedding::halfvec({dims})) halfvec_cosine_ops) WITH (m = 16, ef_construction = 64)"
        f" WHERE dims = {dims}"
    )


async def ensure_indexes(pool: Pool, dims: list[int]) -> None:
    """Create the HNSW index of each vector size (once across processes)."""
    async with migration_lock(pool) as conn:
        for size in sorted(set(dims)):
            await conn.execute(hnsw_index_sql(int(size)))


async def open_knowledge(
    pool: Pool,
    settings: Settings,
    *,
    tracing: Tracing | None = None,
    price: Pricer | None = None,
    url: str | None = None,
) -> PostgresKnowledgeSearch:
    """Return the process's knowledge search, with the HNSW indexes or the cells it uses."""
    kind = knowledge_index_kind(settings, url)
    if kind == "ivf":
        await ensure_cell_index(pool)
    if kind == "hnsw":
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT DISTINCT dims FROM knowledge_bases")
            sizes = [row["dims"] for row in await cur.fetchall()]
        await ensure_indexes(pool, [settings.embedding_dims, *sizes])
    reranker = (
        CrossEncoderReranker(settings.knowledge_rerank_url)
        if settings.knowledge_rerank_url
        else None
    )
    return PostgresKnowledgeSearch(
        pool,
        Embedders(settings, pool, tracing, price),
        tracing=tracing,
        reranker=reranker,
        probes=PROBES if kind == "ivf" else None,
    )
