"""Coarse cells of a knowledge base's vectors: an IVF index in plain SQL.

Where pgvector cannot run HNSW (the embedded build on a CPU without AVX-512), the vector list
would be an exact scan of every chunk. Instead each knowledge base past `MIN_CHUNKS` gets
about √n centroids (k-means on a sample, in SQL with pgvector's half-precision `avg` and
`<=>`), every chunk the number of its nearest centroid, and a search reads only the chunks of
the cells nearest the query, through a covering btree on `(kb_id, cell)` that carries the
vectors (an index-only scan), ranked by exact distance (docs/decisions/1402).
"""

from __future__ import annotations

import logging
import math
import time

from server.db.pool import Conn, Pool, migration_lock

log = logging.getLogger(__name__)

# Below this many chunks an exact scan is fast enough and the cells are not trained.
MIN_CHUNKS = 2_000
# Retrain when the knowledge base has grown this many times since the last training.
GROWTH = 2.0
# Points per centroid in the k-means sample, and Lloyd rounds on it.
SAMPLE_PER_CELL = 40
ROUNDS = 2
# Cells a search reads per knowledge base (docs/knowledge.md has recall and latency).
PROBES = 16

# Created at start-up when the cells are used (server/knowledge/setup.py).
COVERING_INDEX = (
    "CREATE INDEX IF NOT EXISTS kb_chunks_cell ON kb_chunks (kb_id, cell) INCLUDE (id, embedding)"
)

_LLOYD = """
UPDATE kb_cells k SET centroid = n.centroid
FROM (
    SELECT a.cell, avg(s.embedding) AS centroid
    FROM (SELECT embedding FROM kb_chunks WHERE kb_id = %(kb)s ORDER BY random()
          LIMIT %(sample)s) s
    CROSS JOIN LATERAL (SELECT cell FROM kb_cells WHERE kb_id = %(kb)s
                        ORDER BY centroid <=> s.embedding LIMIT 1) a
    GROUP BY a.cell
) n
WHERE k.kb_id = %(kb)s AND k.cell = n.cell
"""

_ASSIGN = """
UPDATE kb_chunks c SET cell = (SELECT k.cell FROM kb_cells k WHERE k.kb_id = c.kb_id
                               ORDER BY k.centroid <=> c.embedding LIMIT 1)
WHERE c.kb_id = %(kb)s
"""


def cell_count(chunks: int) -> int:
    """Return the number of cells for a knowledge base of `chunks` chunks (about √n)."""
    return max(1, min(4096, round(math.sqrt(chunks))))


async def train_cells(
    conn: Conn, kb_id: str, *, cells: int | None = None, seed: float = 0.42
) -> int:
    """Train the cells of knowledge base `kb_id` and assign every chunk; return the cells.

    One transaction: searches see the old cells (or none) until it commits. Chunks stored
    meanwhile by other transactions are assigned by the insert trigger to the old cells and
    re-assigned at the next training; they stay searchable either way.
    """
    began = time.perf_counter()
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('kb_cells:' || %s))", (kb_id,))
        cur = await conn.execute("SELECT count(*) AS n FROM kb_chunks WHERE kb_id = %s", (kb_id,))
        row = await cur.fetchone()
        chunks = int(row["n"]) if row else 0
        k = cells or cell_count(chunks)
        params = {"kb": kb_id, "k": k, "sample": k * SAMPLE_PER_CELL}
        await conn.execute("SELECT setseed(%s)", (seed,))
        await conn.execute("DELETE FROM kb_cells WHERE kb_id = %(kb)s", params)
        await conn.execute(
            "INSERT INTO kb_cells (kb_id, cell, centroid) SELECT %(kb)s,"
            " (row_number() OVER ())::int - 1, embedding FROM (SELECT embedding FROM"
            " (SELECT DISTINCT ON (embedding::text) embedding FROM kb_chunks"
            " WHERE kb_id = %(kb)s) d ORDER BY random() LIMIT %(k)s) s",
            params,
        )
        for _ in range(ROUNDS):
            await conn.execute(_LLOYD, params)
        await conn.execute(_ASSIGN, params)
        await conn.execute(
            "INSERT INTO kb_cell_trainings (kb_id, cells, chunks) VALUES (%(kb)s, %(k)s, %(n)s)"
            " ON CONFLICT (kb_id) DO UPDATE SET cells = EXCLUDED.cells,"
            " chunks = EXCLUDED.chunks, trained_at = now()",
            params | {"n": chunks},
        )
    log.info(
        "knowledge base %s: %d cells trained on %d chunks in %.1f s",
        kb_id,
        k,
        chunks,
        time.perf_counter() - began,
    )
    return k


async def cells_due(conn: Conn, kb_id: str) -> bool:
    """Say whether knowledge base `kb_id` is large enough and has grown enough to (re)train."""
    cur = await conn.execute(
        "SELECT (SELECT count(*) FROM kb_chunks WHERE kb_id = %(kb)s) AS n,"
        " (SELECT chunks FROM kb_cell_trainings WHERE kb_id = %(kb)s) AS trained",
        {"kb": kb_id},
    )
    row = await cur.fetchone()
    if row is None or row["n"] < MIN_CHUNKS:
        return False
    return row["trained"] is None or row["n"] >= GROWTH * row["trained"]


async def maintain_cells(pool: Pool, kb_id: str) -> bool:
    """Train the cells of `kb_id` when they are due; return whether it trained."""
    async with pool.connection() as conn:
        if not await cells_due(conn, kb_id):
            return False
        await train_cells(conn, kb_id)
    return True


async def ensure_cell_index(pool: Pool) -> None:
    """Create the covering index the cell search reads (once across processes)."""
    async with migration_lock(pool) as conn:
        await conn.execute(COVERING_INDEX)
