"""Knowledge at 1,000,000 chunks (`make bench-large`): build time, size, memory, latency.

The same synthetic chunks and timed search as bench/knowledge.py, at a million chunks in one
knowledge base: how long seeding takes (with HNSW, the index is kept up to date by it; with
cells, their training is timed apart), how large the table and its indexes are, the server's
memory, and the hybrid search latency.
"""

from __future__ import annotations

import random
import resource

from bench.common import Figures, run_async
from bench.knowledge import add_scale, latency, seed, settings_for, train
from server.db.pool import migrate, open_pool
from server.knowledge.setup import ensure_indexes, knowledge_index_kind, open_knowledge

COUNT = 1_000_000


async def measure(database_url: str, quick: bool, figures: Figures) -> None:
    """Seed, index and time searches over a million chunks (100,000 when quick)."""
    count = 100_000 if quick else COUNT
    settings = settings_for(database_url)
    async with open_pool(database_url, settings) as pool:
        await migrate(pool)
        search = await open_knowledge(pool, settings)
        kind = knowledge_index_kind(settings, database_url)
        seconds = await seed(pool, settings, "large", count, random.Random(7))
        built = 0.0
        if kind == "hnsw":
            await ensure_indexes(pool, [settings.embedding_dims])
        elif kind == "ivf":
            built = await train(pool, "large")
        timings, _ = await latency(pool, search, "large", 30)
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT pg_total_relation_size('kb_chunks') AS total,"
                " pg_relation_size('kb_chunks') AS heap,"
                " pg_indexes_size('kb_chunks') AS indexes,"
                " current_setting('shared_buffers') AS shared_buffers"
            )
            size = await cur.fetchone()
        assert size is not None
    mib = 1024 * 1024
    figures.add(
        f"{count:,} chunks in one knowledge base, offline embedder ({settings.embedding_dims} "
        f"dims, halfvec), vector index: **{kind}**."
    )
    figures.add("")
    if kind == "hnsw":
        # The index exists from start-up (open_knowledge), so the COPY inserts into it row
        # by row; `ensure_indexes` after it only checks that it is there.
        build = "; the HNSW index, kept up to date by the COPY row by row, in that time"
    elif kind == "ivf":
        build = f", cells trained {built:.0f} s"
    else:
        build = "; no vector index to build"
    figures.add(f"- build: seeding (COPY, embeddings computed) {seconds:.0f} s{build}")
    figures.add(
        f"- size: chunks table {size['total'] / mib:,.0f} MiB in all (heap "
        f"{size['heap'] / mib:,.0f} MiB, indexes {size['indexes'] / mib:,.0f} MiB); "
        f"Postgres shared_buffers {size['shared_buffers']}; the benchmark process peaked at "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB"
    )
    add_scale(figures, count, seconds, timings)


def main(database_url: str, quick: bool) -> Figures:
    """Measure a million-chunk knowledge base."""
    figures = Figures(
        "Knowledge at 1,000,000 chunks", "make bench-large (bench/knowledge_large.py)"
    )
    run_async(measure(database_url, quick, figures), limit_s=4 * 3600)
    return figures
