"""Knowledge at 1,000,000 chunks (`make bench-large`): build time, size, memory, latency.

The same synthetic chunks and timed search as bench/knowledge.py, at a million chunks in one
knowledge base: how long seeding takes and building the vector index after it (with HNSW,
the index is dropped before the COPY and built after it, as for a first load of a large base:
kept up to date row by row, the same seeding took 67 minutes on 2 cores; with cells, their
training), how large the table and its indexes are, the server's memory, and the hybrid
search latency.
"""

from __future__ import annotations

import random
import resource
import time

from bench.common import Figures, run_async
from bench.knowledge import add_scale, latency, seed, settings_for, train
from server.db.pool import migrate, open_pool
from server.knowledge.setup import hnsw_index_sql, knowledge_index_kind, open_knowledge

COUNT = 1_000_000
# Enough for pgvector to build a million chunks' graph in memory.
BUILD_MEMORY = "4GB"


async def measure(database_url: str, quick: bool, figures: Figures) -> None:
    """Seed, index and time searches over a million chunks (100,000 when quick)."""
    count = 100_000 if quick else COUNT
    settings = settings_for(database_url)
    async with open_pool(database_url, settings) as pool:
        await migrate(pool)
        search = await open_knowledge(pool, settings)
        kind = knowledge_index_kind(settings, database_url)
        dims = settings.embedding_dims
        if kind == "hnsw":
            async with pool.connection() as conn:
                await conn.execute(f"DROP INDEX kb_chunks_hnsw_{dims}")
        seconds = await seed(pool, settings, "large", count, random.Random(7))
        built = 0.0
        if kind == "hnsw":
            async with pool.connection() as conn:
                await conn.execute(f"SET maintenance_work_mem = '{BUILD_MEMORY}'")
                began = time.perf_counter()
                await conn.execute(hnsw_index_sql(dims))
                built = time.perf_counter() - began
                await conn.execute("RESET maintenance_work_mem")
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
        build = (
            f", then the HNSW index built {built:.0f} s (maintenance_work_mem {BUILD_MEMORY};"
            " dropped before the COPY, which would otherwise insert into it row by row)"
        )
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
