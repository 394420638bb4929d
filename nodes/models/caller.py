"""One model call, whatever the provider: attempts, timeouts, retries, fallbacks, the ledger.

`ResilientModelCaller.call` streams the answer of the first model that gives one:

- every attempt has a time-to-first-token deadline and an overall deadline;
- a failure is classified (nodes/models/faults.py); a retryable one is retried with
  exponential backoff and jitter, or after the delay the provider asked for (`Retry-After`);
- an item that already streamed part of its text is superseded before the retry
  (docs/events.md, "Model retries and superseded items");
- the circuit breaker of each model is consulted before, and told after, every attempt;
- when a model's attempts are used up (or its circuit is open), the next fallback is tried;
- every attempt, failed or not, is reported as a `usage` event (one ledger row) with the
  run's new totals, and the budget is checked before every attempt.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, message_chunk_to_message
from langchain_core.messages.ai import add_ai_message_chunks
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp

from graphs.events import Emit, EventType, ModelCall
from nodes.errors import ModelCallFailedError
from nodes.models.breaker import CircuitBreakers
from nodes.models.faults import ModelCallError, ModelErrorClass, classify
from nodes.models.normalize import normalize
from nodes.models.usage import TokenUsage, UsageMeter, money

# Providers that always end a stream with a finish reason: one without it was cut short.
_REPORTS_FINISH = frozenset({"openai", "litellm"})


@dataclass(frozen=True)
class ModelChoice:
    """A model a run may call: its id (`provider:model`), its parts, and the chat model."""

    model_id: str
    provider: str
    name: str
    model: BaseChatModel


@dataclass(frozen=True)
class ModelPolicy:
    """How hard to try one model before giving up on it (settings `AGENTRT_MODEL_*`)."""

    max_attempts: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 20.0
    retry_after_max_s: float = 60.0
    timeout_s: float = 120.0
    ttft_timeout_s: float = 30.0
    retry_after_partial: bool = True

    def delay(self, attempt: int, error: ModelCallError, rng: random.Random) -> float | None:
        """Return the wait before attempt `attempt + 1`, or None when it is not worth waiting.

        The provider's `Retry-After` wins when it gave one (up to `retry_after_max_s`);
        otherwise exponential backoff with equal jitter: half fixed, half random.
        """
        wanted = error.retry_after_s
        if wanted is not None:
            return float(wanted) if wanted <= self.retry_after_max_s else None
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2.0 ** (attempt - 1))
        return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


@dataclass
class _Call:
    """One call of the caller: what is asked, and what it has been through so far."""

    messages: Sequence[BaseMessage]
    tools: Sequence[BaseTool]
    emit: Emit
    step: int
    attempts: int = 0
    last: ModelCallError | None = None
    tried: list[dict[str, Any]] = field(default_factory=list)
    supersede: list[str] = field(default_factory=list)  # items to close before the next try


@dataclass
class _Attempt:
    message: AIMessage | None = None
    error: ModelCallError | None = None
    streamed_items: list[str] = field(default_factory=list)
    latency_ms: float = 0.0
    ttft_ms: float | None = None


def _has_output(chunk: AIMessageChunk) -> bool:
    return bool(chunk.content or chunk.tool_call_chunks or chunk.additional_kwargs)


@dataclass
class ResilientModelCaller:
    """Call `choices[0]`, falling back to the next choices; see the module docstring.

    Attributes:
        choices: The requested model first, then its fallbacks in order.
        policy: Attempts, backoff and timeouts per model.
        breakers: The process's circuit breakers, keyed by model id.
        meter: The run's usage totals, prices and budgets.
        rng: Jitter source (seedable in tests).
    """

    choices: Sequence[ModelChoice]
    policy: ModelPolicy = field(default_factory=ModelPolicy)
    breakers: CircuitBreakers | None = None
    meter: UsageMeter = field(default_factory=UsageMeter)
    rng: random.Random = field(default_factory=random.Random)

    async def call(
        self,
        messages: Sequence[BaseMessage],
        tools: Sequence[BaseTool],
        emit: Emit,
        *,
        step: int,
    ) -> AIMessage:
        """Return the first complete answer; raise ModelCallFailedError when there is none.

        Raises:
            ModelCallFailedError: a non-retryable error, or every model failed or is open.
            BudgetExceededError: the run may not make another call.
        """
        call = _Call(messages, tools, emit, step)
        for index in range(len(self.choices)):
            if index > 0:
                self._fall_back(call, index)
            answer = await self._call_model(call, index)
            if answer is not None:
                return answer
        assert call.last is not None
        raise self._failure(call.last, call.attempts, call.tried)

    def _fall_back(self, call: _Call, index: int) -> None:
        assert call.last is not None
        call.emit(
            {
                "event": EventType.MODEL_FALLBACK,
                "fromModel": self.choices[index - 1].model_id,
                "toModel": self.choices[index].model_id,
                "errorClass": call.last.error_class.value,
                "statusCode": call.last.status_code,
                "supersedes": call.supersede,
            }
        )
        call.supersede = []

    async def _call_model(self, call: _Call, index: int) -> AIMessage | None:
        """Try `choices[index]` until it answers, or return None when it is given up on."""
        choice = self.choices[index]
        made = 0
        for attempt in range(1, self.policy.max_attempts + 1):
            self.meter.check_budget()
            if self.breakers is not None and not self.breakers.admit(choice.model_id):
                call.last = ModelCallError(
                    ModelErrorClass.CIRCUIT_OPEN,
                    f"the circuit of {choice.model_id} is open after repeated failures",
                    provider=choice.provider,
                    model=choice.name,
                )
                break
            call.attempts += 1
            made += 1
            result = await self._attempt(choice, call.messages, call.tools)
            self._record(call, choice, result, attempt=attempt, fallback=index)
            if result.message is not None:
                if self.breakers is not None:
                    self.breakers.succeeded(choice.model_id)
                return result.message
            error = result.error
            assert error is not None
            call.last = error
            if self.breakers is not None and error.retryable:
                self.breakers.failed(choice.model_id)
            partial = bool(result.streamed_items) and not self.policy.retry_after_partial
            if not error.retryable or partial:
                call.tried.append(self._tried(choice, made, error))
                # Only a retryable error can be refused a retry for having streamed already.
                raise self._failure(error, call.attempts, call.tried, partial=error.retryable)
            call.supersede = result.streamed_items
            delay = self.policy.delay(attempt, error, self.rng)
            if attempt == self.policy.max_attempts or delay is None:
                break
            self._retry(call, choice, attempt, error, delay)
            await asyncio.sleep(delay)
        assert call.last is not None
        call.tried.append(self._tried(choice, made, call.last))
        return None

    @staticmethod
    def _retry(
        call: _Call, choice: ModelChoice, attempt: int, error: ModelCallError, delay: float
    ) -> None:
        call.emit(
            {
                "event": EventType.MODEL_RETRY,
                "model": choice.model_id,
                "attempt": attempt,
                "errorClass": error.error_class.value,
                "statusCode": error.status_code,
                "delayS": round(delay, 3),
                "supersedes": call.supersede,
            }
        )
        call.supersede = []

    async def _attempt(
        self, choice: ModelChoice, messages: Sequence[BaseMessage], tools: Sequence[BaseTool]
    ) -> _Attempt:
        result = _Attempt()
        bound = choice.model.bind_tools(list(tools)) if tools else choice.model
        loop = asyncio.get_running_loop()
        started = loop.time()
        chunks: list[AIMessageChunk] = []
        first_deadline = started + min(self.policy.ttft_timeout_s, self.policy.timeout_s)
        scope = asyncio.timeout_at(first_deadline)
        try:
            async with scope:
                stream = cast(AsyncGenerator[AIMessageChunk, None], bound.astream(list(messages)))
                async with aclosing(stream):
                    async for chunk in stream:
                        if result.ttft_ms is None and _has_output(chunk):
                            result.ttft_ms = (loop.time() - started) * 1000
                            scope.reschedule(started + self.policy.timeout_s)
                        if chunk.text and chunk.id and chunk.id not in result.streamed_items:
                            result.streamed_items.append(chunk.id)
                        chunks.append(chunk)
        except GraphBubbleUp:
            raise
        except TimeoutError as exc:
            if not scope.expired():
                result.error = classify(exc, provider=choice.provider, model=choice.name)
            elif result.ttft_ms is None:
                result.error = ModelCallError(
                    ModelErrorClass.TTFT_TIMEOUT,
                    f"no output within {min(self.policy.ttft_timeout_s, self.policy.timeout_s):g}"
                    " s (time-to-first-token timeout)",
                    provider=choice.provider,
                    model=choice.name,
                )
            else:
                result.error = ModelCallError(
                    ModelErrorClass.TIMEOUT,
                    f"the call did not finish within {self.policy.timeout_s:g} s",
                    provider=choice.provider,
                    model=choice.name,
                )
        except Exception as exc:
            result.error = classify(exc, provider=choice.provider, model=choice.name)
        result.latency_ms = (loop.time() - started) * 1000
        if result.error is None:
            result.message, result.error = self._assemble(choice, chunks)
        return result

    def _assemble(
        self, choice: ModelChoice, chunks: list[AIMessageChunk]
    ) -> tuple[AIMessage | None, ModelCallError | None]:
        if not chunks:
            return None, ModelCallError(
                ModelErrorClass.BAD_RESPONSE,
                "the model returned no output at all",
                provider=choice.provider,
                model=choice.name,
            )
        # All at once: adding them one by one copies the growing message at every chunk.
        merged = add_ai_message_chunks(chunks[0], *chunks[1:])
        message = message_chunk_to_message(merged)
        assert isinstance(message, AIMessage)
        finish = message.response_metadata.get("finish_reason")
        if finish is None and choice.provider in _REPORTS_FINISH:
            return None, ModelCallError(
                ModelErrorClass.BAD_RESPONSE,
                "the stream ended without a finish reason (cut short)",
                provider=choice.provider,
                model=choice.name,
            )
        return message, None

    def _record(
        self, call: _Call, choice: ModelChoice, result: _Attempt, *, attempt: int, fallback: int
    ) -> None:
        """Count the attempt in the run's totals and emit its `usage` event (a ledger row)."""
        message, error = result.message, result.error
        usage = TokenUsage.from_message(message) if message else TokenUsage()
        cost = (
            self.meter.price(choice.provider, choice.name, choice.model_id, usage)
            if message is not None
            else None
        )
        totals = self.meter.add_call(usage, cost, ok=message is not None)
        call_id = f"mc_{time.time_ns() // 1_000_000:012x}{uuid.uuid4().hex[:20]}"
        finish_reason = None
        if message is not None:
            totals.tool_calls += len(message.tool_calls)
            normal = normalize(message)
            finish_reason = normal.finish_reason
            message.response_metadata["agentrt"] = {
                "callId": call_id,
                "modelId": choice.model_id,
                "attempt": attempt,
                **normal.summary(),
            }
        reported = usage.reported
        row: ModelCall = {
            "callId": call_id,
            "step": call.step,
            "attempt": attempt,
            "modelId": choice.model_id,
            "provider": choice.provider,
            "model": choice.name,
            "requestedModel": self.choices[0].model_id,
            "fallbackIndex": fallback,
            "status": "ok" if message is not None else "failed",
            "latencyMs": round(result.latency_ms, 3),
            "ttftMs": None if result.ttft_ms is None else round(result.ttft_ms, 3),
            "itemId": message.id if message is not None else None,
            "finishReason": finish_reason,
            "inputTokens": usage.input_tokens if reported else None,
            "outputTokens": usage.output_tokens if reported else None,
            "cachedInputTokens": usage.cached_input_tokens if reported else None,
            "reasoningTokens": usage.reasoning_tokens if reported else None,
            "totalTokens": usage.total_tokens if reported else None,
            "cost": money(cost.total) if cost else None,
            "priceSource": cost.source if cost else None,
            "errorClass": error.error_class.value if error else None,
            "statusCode": error.status_code if error else None,
            "error": error.message[:500] if error else None,
        }
        call.emit({"event": EventType.USAGE, "call": row, "totals": totals.to_json()})

    @staticmethod
    def _tried(choice: ModelChoice, attempts: int, error: ModelCallError) -> dict[str, Any]:
        return {
            "model": choice.model_id,
            "attempts": attempts,
            "errorClass": error.error_class.value,
            "statusCode": error.status_code,
        }

    @staticmethod
    def _failure(
        error: ModelCallError, attempts: int, tried: list[dict[str, Any]], *, partial: bool = False
    ) -> ModelCallFailedError:
        where = f"{error.provider}:{error.model}" if error.provider else error.model
        reason = "; its answer had already streamed, so it was not retried" if partial else ""
        status = f" (HTTP {error.status_code})" if error.status_code else ""
        message = (
            f"the model call failed after {attempts} attempt{'s' if attempts != 1 else ''}: "
            f"{where}: {error.error_class.value}{status}: {error.message}{reason}"
        )
        details = {**error.describe(), "attempts": attempts, "tried": tried}
        details.pop("message")
        return ModelCallFailedError(message, details)
