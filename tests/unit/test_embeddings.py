"""The embeddings layer: the offline embedder's geometry, batching, retries, the usage record."""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal

import pytest

from nodes.embeddings.embedder import (
    Embedder,
    EmbeddingCall,
    EmbeddingScope,
    LexicalBackend,
    embedding_scope,
)
from nodes.embeddings.lexical import lexical_vector
from nodes.models.caller import ModelPolicy
from nodes.models.faults import ModelCallError, ModelErrorClass

pytestmark = pytest.mark.timeout(30)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_lexical_vectors_are_unit_length_and_near_for_shared_words() -> None:
    dark = lexical_vector("Prefers dark mode in every editor", 256)
    assert math.isclose(sum(v * v for v in dark), 1.0, rel_tol=1e-9)
    near = lexical_vector("which editor mode do I prefer, dark?", 256)
    far = lexical_vector("The invoice was paid on Tuesday", 256)
    assert cosine(dark, near) > 0.3 > cosine(dark, far)
    assert lexical_vector("", 16)[0] == 1.0  # an empty text stays searchable


class Flaky:
    """Fails with `errors` first, then answers like the lexical backend."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.batches: list[int] = []

    async def embed(self, texts: Sequence[str]) -> tuple[list[list[float]], int | None]:
        self.batches.append(len(texts))
        if self.errors:
            raise self.errors.pop(0)
        return [lexical_vector(t, 8) for t in texts], 7 * len(texts)


async def test_requests_are_batched_retried_on_retryable_faults_and_recorded() -> None:
    calls: list[EmbeddingCall] = []

    async def record(call: EmbeddingCall) -> None:
        calls.append(call)

    rate_limited = ModelCallError(ModelErrorClass.RATE_LIMITED, "slow down", provider="openai")
    backend = Flaky([rate_limited])
    embedder = Embedder(
        "openai:emb",
        8,
        backend,
        policy=ModelPolicy(max_attempts=3, backoff_base_s=0.001),
        record=record,
        batch_size=2,
    )
    with embedding_scope(EmbeddingScope("acme", "ann", "run_1", "extraction")):
        vectors = await embedder.aembed_documents(["a b", "c d", "e f"])
    assert len(vectors) == 3 and backend.batches == [2, 2, 1]
    assert [(c.inputs, c.attempts, c.status) for c in calls] == [(2, 2, "ok"), (1, 1, "ok")]
    assert calls[0].scope == EmbeddingScope("acme", "ann", "run_1", "extraction")
    assert calls[0].input_tokens == 14 and calls[0].cost is None


async def test_a_bad_request_is_not_retried_and_is_recorded_as_an_error() -> None:
    calls: list[EmbeddingCall] = []

    async def record(call: EmbeddingCall) -> None:
        calls.append(call)

    bad = ModelCallError(ModelErrorClass.INVALID_REQUEST, "no such model", provider="openai")
    backend = Flaky([bad])
    embedder = Embedder("openai:emb", 8, backend, record=record)
    with pytest.raises(ModelCallError):
        await embedder.aembed_query("x")
    assert backend.batches == [1]
    assert [(c.status, c.error_class) for c in calls] == [("error", "invalid_request")]


async def test_the_lexical_embedder_is_free_and_counts_words() -> None:
    calls: list[EmbeddingCall] = []

    async def record(call: EmbeddingCall) -> None:
        calls.append(call)

    embedder = Embedder("lexical:v1", 32, LexicalBackend(32), record=record)
    assert len(await embedder.aembed_query("three little words")) == 32
    assert calls[0].cost == Decimal(0) and calls[0].input_tokens == 3


async def test_a_text_repeated_in_a_batch_is_embedded_and_paid_once() -> None:
    # The store embeds a search's query once per namespace it searches.
    backend = Flaky([])
    embedder = Embedder("openai:emb", 8, backend)
    vectors = await embedder.aembed_documents(["dark mode", "tea", "dark mode"])
    assert backend.batches == [2]
    assert vectors[0] == vectors[2] == lexical_vector("dark mode", 8)
    assert vectors[1] == lexical_vector("tea", 8)
