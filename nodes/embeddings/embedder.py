"""Provider-neutral embeddings: `lexical:v1` (offline), `openai:<model>`, `litellm:<model>`.

`Embedder` is a LangChain `Embeddings`, so LangGraph's `AsyncPostgresStore` embeds with it.
It batches, retries with the model fault classes (nodes/models/faults.py), prices each call
and reports it to a recorder (the usage ledger and the trace), attributed to the scope set by
`embedding_scope` or, inside a graph run, to the run's context.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

from langchain_core.embeddings import Embeddings

from nodes.embeddings.lexical import LEXICAL_MODEL, lexical_tokens, lexical_vector
from nodes.models.caller import ModelPolicy
from nodes.models.faults import ModelCallError, classify
from nodes.models.usage import Pricer, TokenUsage

DEFAULT_BATCH = 64


@dataclass(frozen=True)
class EmbeddingScope:
    """Who an embedding call is for: the ledger row's tenant, user, run and purpose."""

    tenant_id: str
    user_id: str | None = None
    run_id: str | None = None
    purpose: str = "memory"


_scope: contextvars.ContextVar[EmbeddingScope | None] = contextvars.ContextVar(
    "agentrt_embedding_scope", default=None
)


@contextlib.contextmanager
def embedding_scope(scope: EmbeddingScope) -> Iterator[None]:
    """Attribute the embedding calls made inside the block to `scope`."""
    token = _scope.set(scope)
    try:
        yield
    finally:
        _scope.reset(token)


def current_scope() -> EmbeddingScope | None:
    """Return the scope set by `embedding_scope`, else the running graph's run, else None."""
    scope = _scope.get()
    if scope is not None:
        return scope
    try:
        from langgraph.runtime import get_runtime

        runtime = get_runtime()
    except RuntimeError:  # not inside a graph run
        return None
    context = getattr(runtime, "context", None)
    tenant = getattr(context, "tenant_id", None)
    if not isinstance(tenant, str):
        return None
    return EmbeddingScope(
        tenant, getattr(context, "user_id", None), getattr(context, "run_id", None), "run"
    )


@dataclass(frozen=True)
class EmbeddingCall:
    """One embedding request as the usage ledger records it.

    Attributes:
        call_id: Unique id of the request.
        model_id, provider, model: Which model.
        inputs: Texts in the batch.
        input_tokens: Tokens the provider counted (words for the lexical embedder).
        cost: Its price, None when unknown; `price_source` says where the price came from.
        status: `ok` or `error`; `error_class` names a failure's class.
        attempts: Tries made, retries included.
        started, ended: When.
        scope: Who it was for, None when nothing said so.
    """

    call_id: str
    model_id: str
    provider: str
    model: str
    inputs: int
    input_tokens: int
    cost: Decimal | None
    price_source: str | None
    status: str
    error_class: str | None
    attempts: int
    started: datetime
    ended: datetime
    scope: EmbeddingScope | None


Recorder = Callable[[EmbeddingCall], Awaitable[None]]


class EmbeddingBackend(Protocol):
    """One provider's embedding request: vectors for `texts`, and tokens if it counts them."""

    async def embed(self, texts: Sequence[str]) -> tuple[list[list[float]], int | None]: ...


class LexicalBackend:
    """The offline embedder (nodes/embeddings/lexical.py)."""

    def __init__(self, dims: int) -> None:
        self.dims = dims

    async def embed(self, texts: Sequence[str]) -> tuple[list[list[float]], int | None]:
        """Embed `texts` offline; return the vectors and an estimate of their tokens."""
        vectors = [lexical_vector(t, self.dims) for t in texts]
        return vectors, sum(lexical_tokens(t) for t in texts)


class OpenAIBackend:
    """`POST /v1/embeddings` on OpenAI or any OpenAI-compatible server."""

    def __init__(
        self, model: str, dims: int, *, api_key: str, base_url: str | None, send_dims: bool
    ) -> None:
        import openai

        self.model = model
        self.dims = dims
        self.send_dims = send_dims
        # Retries are ours (with the model fault classes), not the SDK's.
        self.client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0)

    async def embed(self, texts: Sequence[str]) -> tuple[list[list[float]], int | None]:
        """Embed `texts` through the OpenAI-compatible API; return the vectors and tokens billed."""
        extra: dict[str, Any] = {"dimensions": self.dims} if self.send_dims else {}
        response = await self.client.embeddings.create(
            model=self.model, input=list(texts), encoding_format="float", **extra
        )
        ordered = sorted(response.data, key=lambda d: d.index)
        usage = response.usage
        return [list(d.embedding) for d in ordered], usage.prompt_tokens if usage else None


class LiteLLMBackend:
    """Any embedding model litellm reaches (`litellm:cohere/embed-english-v3.0`...)."""

    def __init__(
        self,
        model: str,
        dims: int,
        *,
        litellm: Any,
        api_base: str | None,
        api_key: str | None,
        send_dims: bool,
    ) -> None:
        self.model = model
        self.dims = dims
        self.litellm = litellm
        self.api_base = api_base
        self.api_key = api_key
        self.send_dims = send_dims

    async def embed(self, texts: Sequence[str]) -> tuple[list[list[float]], int | None]:
        """Embed `texts` through litellm; return the vectors and the tokens billed."""
        extra: dict[str, Any] = {"dimensions": self.dims} if self.send_dims else {}
        response = await self.litellm.aembedding(
            model=self.model,
            input=list(texts),
            api_base=self.api_base,
            api_key=self.api_key,
            num_retries=0,
            **extra,
        )
        data = sorted(response.data, key=lambda d: d["index"])
        usage = getattr(response, "usage", None)
        tokens = getattr(usage, "prompt_tokens", None) if usage is not None else None
        return [list(d["embedding"]) for d in data], tokens


class EmbeddingDimensionError(ValueError):
    """The model returned vectors of another size than the store's column."""


class Embedder(Embeddings):
    """Embed texts in batches, with retries, priced and recorded.

    Args:
        model_id: `provider:model`.
        dims: The vector size every text gets (the store's column size).
        backend: The provider's request.
        policy: Attempts and backoff (the models' policy).
        price: Prices a call (input tokens only); None: cost unknown, except for `lexical`.
        record: Receives every request's `EmbeddingCall`.
        batch_size: Texts per request.
    """

    def __init__(
        self,
        model_id: str,
        dims: int,
        backend: EmbeddingBackend,
        *,
        policy: ModelPolicy | None = None,
        price: Pricer | None = None,
        record: Recorder | None = None,
        batch_size: int = DEFAULT_BATCH,
    ) -> None:
        self.model_id = model_id
        self.provider, _, self.model = model_id.partition(":")
        self.dims = dims
        self.backend = backend
        self.policy = policy or ModelPolicy()
        self.price = price
        self.record = record
        self.batch_size = max(1, batch_size)
        self._rng = random.Random()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed `texts`, `batch_size` per request; a text given twice is embedded (paid) once.

        The store embeds a search's query once per namespace searched, so repeats are common.
        """
        unique = list(dict.fromkeys(texts))
        vectors: list[list[float]] = []
        for start in range(0, len(unique), self.batch_size):
            vectors += await self._request(unique[start : start + self.batch_size])
        found = dict(zip(unique, vectors, strict=True))
        return [found[t] for t in texts]

    async def aembed_query(self, text: str) -> list[float]:
        """Embed one search text."""
        return (await self._request([text]))[0]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed synchronously: only the offline embedder can (no event loop needed)."""
        if not isinstance(self.backend, LexicalBackend):
            raise NotImplementedError(f"{self.model_id}: use aembed_documents")
        return [lexical_vector(t, self.dims) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        """Embed one search text synchronously (offline embedder only)."""
        return self.embed_documents([text])[0]

    async def _request(self, texts: list[str]) -> list[list[float]]:
        started = datetime.now(UTC)
        scope = current_scope()
        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout(self.policy.timeout_s):
                    vectors, tokens = await self.backend.embed(texts)
                if any(len(v) != self.dims for v in vectors) or len(vectors) != len(texts):
                    raise EmbeddingDimensionError(
                        f"{self.model_id} returned {len(vectors)} vectors of "
                        f"{len(vectors[0]) if vectors else 0} numbers for {len(texts)} texts; "
                        f"the memory store holds {self.dims} (AGENTRT_EMBEDDING_DIMS)"
                    )
            except EmbeddingDimensionError:
                await self._report(texts, 0, "error", "bad_response", attempt, started, scope)
                raise
            except Exception as exc:
                error = classify(exc, provider=self.provider, model=self.model)
                wait = self.policy.delay(attempt, error, self._rng) if error.retryable else None
                if wait is None or attempt >= self.policy.max_attempts:
                    await self._report(
                        texts, 0, "error", str(error.error_class), attempt, started, scope
                    )
                    raise error from exc
                await asyncio.sleep(wait)
                continue
            counted = tokens if tokens is not None else sum(lexical_tokens(t) for t in texts)
            await self._report(texts, counted, "ok", None, attempt, started, scope)
            return vectors

    async def _report(
        self,
        texts: Sequence[str],
        tokens: int,
        status: str,
        error_class: str | None,
        attempts: int,
        started: datetime,
        scope: EmbeddingScope | None,
    ) -> None:
        if self.record is None:
            return
        cost, source = self._cost(tokens)
        call = EmbeddingCall(
            call_id=f"emb_{uuid.uuid4().hex}",
            model_id=self.model_id,
            provider=self.provider,
            model=self.model,
            inputs=len(texts),
            input_tokens=tokens,
            cost=cost,
            price_source=source,
            status=status,
            error_class=error_class,
            attempts=attempts,
            started=started,
            ended=datetime.now(UTC),
            scope=scope,
        )
        await self.record(call)

    def _cost(self, tokens: int) -> tuple[Decimal | None, str | None]:
        if self.provider == "lexical":
            return Decimal(0), "local"
        if self.price is None:
            return None, None
        priced = self.price(self.provider, self.model, self.model_id, TokenUsage(tokens, 0))
        return (priced.total, priced.source) if priced is not None else (None, None)


__all__ = [
    "LEXICAL_MODEL",
    "Embedder",
    "EmbeddingCall",
    "EmbeddingDimensionError",
    "EmbeddingScope",
    "LexicalBackend",
    "LiteLLMBackend",
    "ModelCallError",
    "OpenAIBackend",
    "current_scope",
    "embedding_scope",
]
