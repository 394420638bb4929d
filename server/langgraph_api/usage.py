"""Usage of any LangChain chat model a graph calls, recorded through callbacks.

agentrt's own agent meters its calls in its model caller; a graph of langgraph.json calls
whatever chat model it likes, so each call is seen by this handler instead: it is priced
(the PriceBook), counted in the run's totals and budget, and stored as a `usage` event whose
ledger row the usage ledger writes, as for every run.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from graphs.events import EventType, ModelCall
from nodes.models.usage import TokenUsage, UsageMeter, money

Emit = Callable[[EventType, dict[str, Any]], None]


class UsageCallbackHandler(AsyncCallbackHandler):
    """Record each chat model call of a run as a `usage` event; refuse calls over budget.

    Args:
        meter: The run's totals, prices and budget.
        emit: Stores one event of the run.
        attempt: The run's attempt number.
    """

    raise_error = True  # a budget refusal must stop the call, not be logged and ignored

    def __init__(self, meter: UsageMeter, emit: Emit, attempt: int) -> None:
        self.meter = meter
        self.emit = emit
        self.attempt = attempt
        self._calls: dict[UUID, tuple[float, str, str]] = {}

    async def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Check the budget and remember which model is called."""
        self.meter.check_budget()
        meta = metadata or {}
        params = kwargs.get("invocation_params") or {}
        provider = str(meta.get("ls_provider") or serialized.get("name") or "unknown")
        model = str(meta.get("ls_model_name") or params.get("model") or "unknown")
        self._calls[run_id] = (time.perf_counter(), provider, model)

    async def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Record a finished call."""
        message = next(
            (
                g.message
                for gens in response.generations
                for g in gens
                if isinstance(g, ChatGeneration) and isinstance(g.message, AIMessage)
            ),
            None,
        )
        await self._record(run_id, message, None)

    async def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Record a failed call."""
        await self._record(run_id, None, error)

    async def _record(
        self, run_id: UUID, message: AIMessage | None, error: BaseException | None
    ) -> None:
        started = self._calls.pop(run_id, None)
        if started is None:
            return  # not a chat model call (a completion model reports no start here)
        began, provider, model = started
        usage = TokenUsage.from_message(message) if message is not None else TokenUsage()
        model_id = f"{provider}:{model}"
        # Off the event loop: the first price from litellm's map imports litellm (seconds),
        # which would stop every run of the process and its lease heartbeats meanwhile.
        cost = await asyncio.to_thread(self.meter.price, provider, model, model_id, usage)
        totals = self.meter.add_call(usage, cost, ok=error is None)
        if message is not None:
            totals.tool_calls += len(message.tool_calls)
        reported = usage.reported
        row: ModelCall = {
            "callId": f"mc_{time.time_ns() // 1_000_000:012x}{uuid.uuid4().hex[:20]}",
            "step": totals.model_calls,
            "attempt": self.attempt,
            "modelId": model_id,
            "provider": provider,
            "model": model,
            "requestedModel": model_id,
            "fallbackIndex": 0,
            "status": "ok" if error is None else "failed",
            "latencyMs": round((time.perf_counter() - began) * 1000, 3),
            "ttftMs": None,
            "itemId": message.id if message is not None else None,
            "finishReason": (message.response_metadata or {}).get("finish_reason")
            if message is not None
            else None,
            "inputTokens": usage.input_tokens if reported else None,
            "outputTokens": usage.output_tokens if reported else None,
            "cachedInputTokens": usage.cached_input_tokens if reported else None,
            "reasoningTokens": usage.reasoning_tokens if reported else None,
            "totalTokens": usage.total_tokens if reported else None,
            "cost": money(cost.total) if cost else None,
            "priceSource": cost.source if cost else None,
            "errorClass": type(error).__name__ if error is not None else None,
            "statusCode": getattr(error, "status_code", None),
            "error": str(error)[:500] if error is not None else None,
        }
        self.emit(EventType.USAGE, {"call": row, "totals": totals.to_json()})
