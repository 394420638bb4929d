"""Hybrid search on Postgres: pgvector similarity and full-text search, fused by rank.

One statement per search, after the knowledge bases the caller may see (tenant, profile and
role filters in SQL) and the query's words: per embedding model the nearest chunks by cosine
distance on half-precision vectors, the best full-text matches (`tsvector`, ranked among a
bounded set of candidates chosen by the words' frequency, server/knowledge/terms.py), and
fuzzy matches of document titles (`pg_trgm`), fused by reciprocal rank (docs/decisions/1400,
1403). A `retrieval` span goes into the run's trace.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from psycopg.types.json import Jsonb

from nodes.embeddings.embedder import Embedder, EmbeddingScope, embedding_scope
from nodes.models.usage import Pricer
from server.db.pool import Conn, Pool
from server.knowledge.rerank import Reranker
from server.knowledge.terms import TextQuery, WordStatsCache, choose_words, tsquery
from server.memory.store import make_embedder
from server.observability.tracing import Tracing
from server.settings import Settings
from tools.knowledge.search import KnowledgeHit, KnowledgeQuery, KnowledgeResult

# Fusion tuned on bench/data/knowledge_eval.json (docs/decisions/1402): a smaller k favours
# the top of each list; the lexical vector list counts for less than the full-text one.
RRF_K = 20
COMMON_WORD_SHARE = 0.1
TEXT_CANDIDATES = 500
# pg_trgm's default `word_similarity_threshold`; the title trigrams of migration 0031 are
# chosen for it, so a change needs a migration (docs/decisions/1404).
TITLE_SIMILARITY = 0.6
Method = Literal["hybrid", "vector", "text"]

_ALLOWED = """
SELECT id, name, embedding_model, dims FROM knowledge_bases
WHERE tenant_id = %(tenant)s
  AND (%(profile)s::text IS NULL OR cardinality(allowed_profiles) = 0
       OR %(profile)s = ANY(allowed_profiles))
  AND (cardinality(allowed_roles) = 0 OR allowed_roles && %(roles)s::text[]
       OR 'admin' = ANY(%(roles)s::text[]))
ORDER BY name
"""


def vector_literal(vector: Sequence[float]) -> str:
    """Return a vector as pgvector's text form."""
    return "[" + ",".join(f"{x:.6g}" for x in vector) + "]"


def _filter_sql(filters: Mapping[str, str], params: dict[str, Any]) -> str:
    if not filters:
        return ""
    params["filters"] = Jsonb(dict(filters))
    return " AND c.metadata @> %(filters)s::jsonb"


def hybrid_sql(
    models: Sequence[tuple[int, int]],
    *,
    method: Method = "hybrid",
    filters: str = "",
    probes: int | None = None,
) -> str:
    """Return the fused search statement.

    `models` are (index of the query vector parameter, dims) per embedding model; the chunks
    of each are searched with their own query vector. With `probes`, the vector list reads
    the chunks of the nearest cells only (server/knowledge/cells.py; parameter `probes`).
    """
    lists: list[str] = []
    if method in ("hybrid", "vector") and probes:
        lists.extend(cell_list(i, filters) for i, _ in models)
    elif method in ("hybrid", "vector"):
        for i, dims in models:
            distance = f"(c.embedding::halfvec({dims})) <=> %(vec{i})s::halfvec({dims})"
            lists.append(
                f"(SELECT c.id, 'v' AS list, row_number() OVER (ORDER BY {distance}) AS r"
                f" FROM kb_chunks c WHERE c.kb_id = ANY(%(kbs{i})s) AND c.dims = {dims}{filters}"
                f" ORDER BY {distance} LIMIT %(depth)s)"
            )
    if method in ("hybrid", "text"):
        # Rank only the candidates (t1 to t3 below), and only the best `depth` of them in order.
        lists.append(
            "(SELECT x.id, 't' AS list, row_number() OVER (ORDER BY x.rank DESC, x.id) AS r"
            " FROM (SELECT t.id, ts_rank(t.tsv, %(any)s::tsquery, 1) AS rank FROM"
            " (SELECT * FROM t1 UNION ALL SELECT * FROM t2 UNION ALL SELECT * FROM t3) t"
            " ORDER BY rank DESC, t.id"
            " LIMIT %(depth)s) x)"
        )
    if method == "hybrid":
        # Fuzzy names: documents whose title is (nearly) a word of the query, typos included.
        # `word_similarity` runs only on the titles sharing two of their kept trigrams with
        # the query (migrations 0031 and 0044, docs/decisions/2040); OFFSET 0 keeps it from
        # being pushed below the join.
        lists.append(
            "(SELECT c.id, 'n' AS list, row_number() OVER (ORDER BY t.sim DESC,"
            " ts_rank(c.tsv, %(any)s::tsquery, 1) DESC, c.position) AS r FROM (SELECT s.id, s.sim"
            " FROM (SELECT d.id, word_similarity(d.title, %(text)s) AS sim FROM (SELECT"
            " g.document_id FROM kb_title_trigrams g WHERE g.trigram = ANY(show_trgm(%(text)s))"
            " AND g.kb_id = ANY(%(kbs)s) GROUP BY g.document_id HAVING count(*) >= 2) g"
            " JOIN kb_documents d ON d.id = g.document_id"
            f" OFFSET 0) s WHERE s.sim >= {TITLE_SIMILARITY}::float8 ORDER BY s.sim DESC LIMIT 3) t"
            f" JOIN kb_chunks c ON c.document_id = t.id WHERE true{filters}"
            " ORDER BY t.sim DESC, ts_rank(c.tsv, %(any)s::tsquery, 1) DESC, c.position"
            " LIMIT %(names)s)"
        )
    union = "\nUNION ALL\n".join(lists)
    tiers = text_tiers(filters) if method in ("hybrid", "text") else ""
    return f"""
WITH {tiers}ranked AS ({union}),
fused AS (
    SELECT id, sum(CASE list WHEN 'v' THEN %(wv)s::float8 WHEN 't' THEN %(wt)s::float8
            ELSE %(wn)s::float8 END
            / ({RRF_K} + r)) AS score,
        min(r) FILTER (WHERE list = 'v') AS vector_rank,
        min(r) FILTER (WHERE list = 't') AS text_rank
    FROM ranked GROUP BY id
)
SELECT c.id, c.kb_id, c.document_id, c.position, c.heading_path, c.page, c.text,
    d.title, d.source_url, f.score, f.vector_rank, f.text_rank
FROM fused f JOIN kb_chunks c ON c.id = f.id JOIN kb_documents d ON d.id = c.document_id
ORDER BY f.score DESC, c.id LIMIT %(limit)s
"""


def text_tiers(filters: str = "") -> str:
    """Return the full-text candidates, in tiers widened only while they hold too few chunks.

    t1: the chunks holding every word of the query; t2: those holding one of its rarest
    pairs of words (`pairs`, one GIN scan each); t3: those holding a selecting word
    (`match`). Each tier is at most `cap` chunks, so the rank runs on a bounded set
    (server/knowledge/terms.py, docs/decisions/1403).
    """
    return f"""t1 AS MATERIALIZED (
    SELECT c.id, c.tsv FROM kb_chunks c
    WHERE c.tsv @@ %(all)s::tsquery AND c.kb_id = ANY(%(kbs)s){filters} LIMIT %(cap)s
),
t2 AS MATERIALIZED (
    SELECT c.id, c.tsv FROM kb_chunks c
    WHERE (SELECT count(*) FROM t1) < %(depth)s
        AND c.tsv @@ ANY(%(pairs)s::tsquery[]) AND NOT c.tsv @@ %(all)s::tsquery
        AND c.kb_id = ANY(%(kbs)s){filters} LIMIT %(cap)s
),
t3 AS MATERIALIZED (
    SELECT c.id, c.tsv FROM kb_chunks c
    WHERE %(widen)s AND (SELECT count(*) FROM t1) + (SELECT count(*) FROM t2) < %(depth)s
        AND c.tsv @@ %(match)s::tsquery AND NOT c.tsv @@ ANY(%(pairs)s::tsquery[])
        AND NOT c.tsv @@ %(all)s::tsquery AND c.kb_id = ANY(%(kbs)s){filters} LIMIT %(cap)s
),
"""


def cell_list(i: int, filters: str = "") -> str:
    """Return the vector list of model `i` read through the cells nearest its query vector.

    Per knowledge base, the chunks of the `probes` cells whose centroids are nearest the
    query, from the covering index `(kb_id, cell) INCLUDE (id, embedding)` in one index scan,
    the best `depth` by exact distance; with the chunks not yet in a cell (untrained bases)
    scanned exactly.
    """
    distance = f"c.embedding <=> %(vec{i})s::halfvec"
    return (
        f"(SELECT v.id, 'v' AS list, row_number() OVER (ORDER BY v.d, v.id) AS r FROM ("
        f" SELECT n.id, n.d FROM unnest(%(kbs{i})s::text[]) AS b(kb_id) CROSS JOIN LATERAL ("
        f" SELECT c.id, {distance} AS d FROM kb_chunks c WHERE c.kb_id = b.kb_id"
        " AND c.cell = ANY(ARRAY(SELECT k.cell FROM kb_cells k WHERE k.kb_id = b.kb_id"
        f" ORDER BY k.centroid <=> %(vec{i})s::halfvec LIMIT %(probes)s)){filters}"
        " ORDER BY d, c.id LIMIT %(depth)s) n"
        f" UNION ALL (SELECT c.id, {distance} AS d FROM kb_chunks c"
        f" WHERE c.kb_id = ANY(%(kbs{i})s) AND c.cell IS NULL{filters}"
        " ORDER BY d, c.id LIMIT %(depth)s)"
        ") v ORDER BY v.d, v.id LIMIT %(depth)s)"
    )


def text_params(text: TextQuery, candidates: int) -> dict[str, Any]:
    """Return the statement's full-text parameters for `text`."""
    return {
        "any": tsquery(text.words, "|"),
        "all": tsquery(text.words, "&"),
        "pairs": [tsquery(pair, "&") for pair in text.pairs],
        "match": tsquery(text.select, "|"),
        "widen": not text.all_needed,
        "cap": candidates,
    }


@dataclass
class Embedders:
    """One embedder per embedding model id, made from the settings on first use."""

    settings: Settings
    pool: Pool | None = None
    tracing: Tracing | None = None
    price: Pricer | None = None
    _made: dict[str, Embedder] = field(default_factory=dict)

    def get(self, model_id: str, dims: int | None = None) -> Embedder:
        """Return the embedder of `model_id` (`provider:model`)."""
        key = f"{model_id}/{dims}"
        if key not in self._made:
            update: dict[str, Any] = {"embedding_model": model_id}
            if dims is not None:
                update["embedding_dims"] = dims
            self._made[key] = make_embedder(
                self.settings.model_copy(update=update),
                pool=self.pool,
                tracing=self.tracing,
                price=self.price,
            )
        return self._made[key]


@dataclass
class PostgresKnowledgeSearch:
    """`KnowledgeSearch` on our pool (tools/knowledge/search.py)."""

    pool: Pool
    embedders: Embedders
    tracing: Tracing | None = None
    reranker: Reranker | None = None
    depth: int = 40
    # Reciprocal-rank weights of the vector, full-text and title lists.
    weights: tuple[float, float, float] = (0.3, 1.0, 1.0)
    # Cells probed per knowledge base (server/knowledge/cells.py); None: no cells (exact or
    # HNSW).
    probes: int | None = None
    # A query word in more than this share of all chunks (the planner's statistics) does not
    # select full-text candidates on its own; it still counts in their rank.
    common: float = COMMON_WORD_SHARE
    # Chunks the selecting words may match by the statistics' estimate, and the most chunks
    # each full-text tier ranks (docs/decisions/1403).
    candidates: int = TEXT_CANDIDATES
    # Per search object: `dataclasses.replace` starts a fresh cache.
    word_stats: WordStatsCache = field(default_factory=WordStatsCache, init=False, compare=False)

    async def search(self, query: KnowledgeQuery, *, method: Method = "hybrid") -> KnowledgeResult:
        """Return the best chunks of the knowledge bases `query` may search."""
        started, clock = datetime.now(UTC), time.perf_counter()
        async with self.pool.connection() as conn:
            result = await self.search_on(conn, query, method=method)
        if self.reranker is not None and result.hits:
            result = await self.reranker.rerank(query.text, result)
        if self.tracing is not None and query.run_id:
            self.tracing.record_span(
                query.run_id,
                "retrieval",
                started,
                datetime.now(UTC),
                {
                    "agentrt.kind": "retrieval",
                    "agentrt.knowledge_bases": ",".join(result.searched),
                    "agentrt.hits": len(result.hits),
                    "agentrt.top_k": query.top_k,
                    "agentrt.reranked": result.reranked,
                    "agentrt.search_ms": round((time.perf_counter() - clock) * 1000, 2),
                },
            )
        return result

    async def text_query(self, conn: Conn, text: str) -> TextQuery:
        """Return the full-text query of `text`: its lexemes and those that select."""
        cur = await conn.execute(
            "SELECT tsvector_to_array(to_tsvector('english', %s)) AS words", (text,)
        )
        row = await cur.fetchone()
        words = list(row["words"]) if row else []
        stats = await self.word_stats.get(conn)
        return choose_words(words, stats, common=self.common, budget=self.candidates)

    async def search_on(
        self, conn: Conn, query: KnowledgeQuery, *, method: Method = "hybrid"
    ) -> KnowledgeResult:
        """Search on `conn` (benchmarks reuse one connection)."""
        cur = await conn.execute(
            _ALLOWED,
            {"tenant": query.tenant_id, "profile": query.profile, "roles": list(query.roles)},
        )
        allowed = await cur.fetchall()
        wanted = None if query.knowledge_bases is None else set(query.knowledge_bases)
        bases = [b for b in allowed if wanted is None or b["name"] in wanted]
        denied = sorted(wanted - {b["name"] for b in bases}) if wanted is not None else []
        if not bases or not query.text.strip():
            return KnowledgeResult([], [b["name"] for b in bases], denied)
        by_model: dict[tuple[str, int], list[str]] = {}
        for base in bases:
            by_model.setdefault((base["embedding_model"], base["dims"]), []).append(base["id"])
        params: dict[str, Any] = {
            "text": query.text,
            "kbs": [b["id"] for b in bases],
            "depth": self.depth,
            "names": 10,
            "limit": query.top_k,
            "wv": self.weights[0],
            "wt": self.weights[1],
            "wn": self.weights[2],
            "probes": self.probes,
        }
        params |= text_params(await self.text_query(conn, query.text), self.candidates)
        models: list[tuple[int, int]] = []
        if method != "text":
            scope = EmbeddingScope(query.tenant_id, None, query.run_id, "knowledge")
            for i, ((model_id, dims), ids) in enumerate(by_model.items()):
                with embedding_scope(scope):
                    vector = await self.embedders.get(model_id, dims).aembed_query(query.text)
                params[f"vec{i}"], params[f"kbs{i}"] = vector_literal(vector), ids
                models.append((i, dims))
        sql = hybrid_sql(
            models, method=method, filters=_filter_sql(query.filters, params), probes=self.probes
        )
        # Planned with its values, every time (ADR 2038): a generic plan knows neither the
        # query's words nor the LIMIT's reach, and its shape followed the table's state. On a
        # base just loaded, the full-text pairs' tier walked the base's `kb_id` index and
        # read every chunk (100,000 chunks: 154 ms against 11 ms); with HNSW the vector list
        # took 52 ms against 3.6 ms (ADR 2037). Forced, not left to `auto`, which may switch
        # to the generic plan after five searches; only for this statement: SET LOCAL ends
        # with its transaction.
        async with conn.transaction():
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            cur = await conn.execute(sql, params)
            rows = await cur.fetchall()
        names = {b["id"]: b["name"] for b in bases}
        hits = [
            KnowledgeHit(
                chunk_id=row["id"],
                knowledge_base=names[row["kb_id"]],
                document_id=row["document_id"],
                title=row["title"],
                position=row["position"],
                heading_path=tuple(row["heading_path"] or ()),
                page=row["page"],
                source_url=row["source_url"],
                text=row["text"],
                score=float(row["score"]),
                rank=rank,
                vector_rank=row["vector_rank"],
                text_rank=row["text_rank"],
            )
            for rank, row in enumerate(rows, start=1)
        ]
        return KnowledgeResult(hits, [b["name"] for b in bases], denied)
