"""Memory recall in one exact, narrow statement, with or without the HNSW index.

`AsyncPostgresStore` runs one statement per namespace, joining `store` to `store_vectors`
and carrying every row's `value` through the sort. Recall searches two leaf namespaces (the
user's and the tenant's shared memories), each a few thousand vectors at most, so here both
are read in one statement: the vectors from a covering index on the namespace (an index-only
scan of a few contiguous pages instead of a heap page per memory), sorted by exact
half-precision cosine distance, and `store` joined for the top rows only
(docs/decisions/1302).

An HNSW index does not serve recall better: every search is filtered to one user's
namespace, a small share of the vectors, so the index walk reads and discards the other
users' neighbours (`hnsw.iterative_scan`), which took 84 ms at the median for 100 users'
100,000 memories against a few for the exact statement (docs/decisions/2036). With the
index, recall still takes the exact statement; the index serves the searches this module
does not shape (filters, prefixes above a namespace).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from langgraph.store.base import SearchOp
from langgraph.store.postgres import AsyncPostgresStore
from langgraph.store.postgres.base import (
    VECTOR_MIGRATIONS,
    Row,
    _decode_ns_bytes,
    _namespace_to_text,
    _row_to_search_item,
)
from psycopg import AsyncCursor
from psycopg.rows import DictRow

# The last label of a memory namespace; nothing is stored below one (tools/memory/book.py).
LEAF = "memories"

# Created with the store's tables (server/memory/store.py), with or without the HNSW index.
COVERING_INDEX = (
    "CREATE INDEX IF NOT EXISTS store_vectors_prefix_cover ON store_vectors (prefix)"
    " INCLUDE (key, embedding)"
)

FLAT_SEARCH = """
SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, 1 - top.distance AS score,
    top.op
FROM unnest(%(prefixes)s::text[], %(limits)s::int[]) WITH ORDINALITY AS ns(prefix, lim, op)
CROSS JOIN LATERAL (
    SELECT sv.prefix, sv.key, ns.op, min(sv.embedding <=> %(vec)s::halfvec) AS distance
    FROM store_vectors sv
    WHERE sv.prefix = ns.prefix
    GROUP BY sv.prefix, sv.key
    ORDER BY distance, sv.key
    LIMIT ns.lim
) top
JOIN store s ON s.prefix = top.prefix AND s.key = top.key
ORDER BY top.op, top.distance, s.key
"""


def flat_searchable(op: SearchOp) -> bool:
    """Say whether `op` is a similarity search of one memory namespace without filters."""
    ns = op.namespace_prefix
    return bool(op.query) and not op.filter and len(ns) >= 3 and ns[-1] == LEAF


class FlatMemoryStore(AsyncPostgresStore):
    """The store without a vector index: exact scans, recall in one narrow statement.

    The async `setup()` ignores a migration's condition (the sync one skips the index for
    kind `flat`); the index migration, the last one, is left out here instead. Searches this
    class does not shape (filters, prefixes above a namespace, lists) go to the parent.
    """

    VECTOR_MIGRATIONS = [m for m in VECTOR_MIGRATIONS if m.condition is None]

    async def _batch_search_ops(
        self,
        search_ops: Sequence[tuple[int, SearchOp]],
        results: list[Any],
        cur: AsyncCursor[DictRow],
    ) -> None:
        ours = [(i, op) for i, op in search_ops if flat_searchable(op)]
        rest = [(i, op) for i, op in search_ops if not flat_searchable(op)]
        if self._omit_expired or not ours or self.embeddings is None:
            await super()._batch_search_ops(search_ops, results, cur)
            return
        if rest:
            await super()._batch_search_ops(rest, results, cur)
        texts = sorted({cast(str, op.query) for _, op in ours})
        vectors = dict(zip(texts, await self.embeddings.aembed_documents(texts), strict=True))
        for text, vector in vectors.items():
            batch = [(i, op) for i, op in ours if op.query == text]
            await cur.execute(
                FLAT_SEARCH,
                {
                    "prefixes": [_namespace_to_text(op.namespace_prefix) for _, op in batch],
                    "limits": [op.limit + op.offset for _, op in batch],
                    "vec": "[" + ",".join(repr(float(x)) for x in vector) + "]",
                },
            )
            rows: list[dict[str, Any]] = list(await cur.fetchall())
            for n, (idx, op) in enumerate(batch, start=1):
                mine = [cast(Row, r) for r in rows if r["op"] == n]
                results[idx] = [
                    _row_to_search_item(_decode_ns_bytes(r["prefix"]), r, loader=self._deserializer)
                    for r in mine[op.offset :]
                ]


class IndexedMemoryStore(FlatMemoryStore):
    """The store with LangGraph's HNSW index, for the searches recall's statement leaves.

    Recall (an unfiltered search of a memory namespace) takes the exact statement as without
    the index; filtered searches and prefixes above a namespace use the index.
    """

    VECTOR_MIGRATIONS = list(VECTOR_MIGRATIONS)
