"""Typed usage records: one model call's tokens and cost, the run's totals, and its budgets.

Money is `Decimal` and travels as a string in events and JSON. A call whose price is unknown
has `cost=None`; the run's `cost` is then unknown too (`knownCost` still sums what is known).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from langchain_core.messages import AIMessage

from nodes.errors import BudgetExceededError


@dataclass(frozen=True)
class TokenUsage:
    """Tokens one call used, as the provider reported them.

    `input_tokens` includes `cached_input_tokens`; `output_tokens` includes
    `reasoning_tokens` (the OpenAI and langchain-core convention).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    reported: bool = False

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    @classmethod
    def from_message(cls, message: AIMessage) -> TokenUsage:
        """Read langchain-core's `usage_metadata` (absent when the provider sent none)."""
        meta = message.usage_metadata
        if not meta:
            return cls()
        input_details: Mapping[str, Any] = meta.get("input_token_details") or {}
        output_details: Mapping[str, Any] = meta.get("output_token_details") or {}
        return cls(
            input_tokens=int(meta.get("input_tokens") or 0),
            output_tokens=int(meta.get("output_tokens") or 0),
            cached_input_tokens=int(input_details.get("cache_read") or 0),
            reasoning_tokens=int(output_details.get("reasoning") or 0),
            reported=True,
        )


@dataclass(frozen=True)
class CallCost:
    """What a call cost, and where the price came from (`settings` or `litellm`)."""

    total: Decimal
    source: str


# (provider, model name, model id, usage) -> cost, or None when no price is known.
Pricer = Callable[[str, str, str, TokenUsage], CallCost | None]


def money(value: Decimal | None) -> str | None:
    """Render money as a plain decimal string (no exponent), or None."""
    return None if value is None else format(value.normalize(), "f")


@dataclass
class RunTotals:
    """A run's usage so far: what the `usage` event reports and the run record keeps."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    known_cost: Decimal = Decimal(0)
    unpriced_calls: int = 0
    model_calls: int = 0
    failed_model_calls: int = 0
    tool_calls: int = 0

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens over every call."""
        return self.input_tokens + self.output_tokens

    @property
    def cost(self) -> Decimal | None:
        """The run's cost, or None when some successful call had no known price."""
        return None if self.unpriced_calls else self.known_cost

    def to_json(self) -> dict[str, Any]:
        """Render as the `usage` event's `totals` (money as strings)."""
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cachedInputTokens": self.cached_input_tokens,
            "reasoningTokens": self.reasoning_tokens,
            "totalTokens": self.total_tokens,
            "cost": money(self.cost),
            "knownCost": money(self.known_cost),
            "unpricedCalls": self.unpriced_calls,
            "modelCalls": self.model_calls,
            "failedModelCalls": self.failed_model_calls,
            "toolCalls": self.tool_calls,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RunTotals:
        """Rebuild totals stored by `to_json` (the run's snapshot), or zeros."""
        if not data:
            return cls()
        return cls(
            input_tokens=int(data.get("inputTokens", 0)),
            output_tokens=int(data.get("outputTokens", 0)),
            cached_input_tokens=int(data.get("cachedInputTokens", 0)),
            reasoning_tokens=int(data.get("reasoningTokens", 0)),
            known_cost=Decimal(data.get("knownCost") or 0),
            unpriced_calls=int(data.get("unpricedCalls", 0)),
            model_calls=int(data.get("modelCalls", 0)),
            failed_model_calls=int(data.get("failedModelCalls", 0)),
            tool_calls=int(data.get("toolCalls", 0)),
        )


@dataclass(frozen=True)
class Budget:
    """Per-run limits; None means no limit."""

    max_tokens: int | None = None
    max_cost: Decimal | None = None
    max_model_calls: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Render for events and the run record."""
        return {
            "maxTokens": self.max_tokens,
            "maxCost": money(self.max_cost),
            "maxModelCalls": self.max_model_calls,
        }


@dataclass
class UsageMeter:
    """Price each call, keep the run's totals, and refuse a call the budget does not allow.

    The server seeds it with the totals already stored for the run (its snapshot), so a run
    resumed after a crash keeps counting where the event log stopped.
    """

    pricer: Pricer | None = None
    budget: Budget = field(default_factory=Budget)
    totals: RunTotals = field(default_factory=RunTotals)

    def check_budget(self) -> None:
        """Raise BudgetExceededError if the run may not make another model call."""
        t, b = self.totals, self.budget
        if b.max_model_calls is not None and t.model_calls >= b.max_model_calls:
            self._refuse("maxModelCalls", b.max_model_calls, t.model_calls, "model calls")
        if b.max_tokens is not None and t.total_tokens >= b.max_tokens:
            self._refuse("maxTokens", b.max_tokens, t.total_tokens, "tokens")
        if b.max_cost is not None and t.known_cost >= b.max_cost:
            self._refuse("maxCost", b.max_cost, t.known_cost, "cost")

    def _refuse(self, limit: str, allowed: Any, used: Any, what: str) -> None:
        raise BudgetExceededError(
            f"the run's budget of {allowed} {what} is used up ({used} used); "
            f"raise run option {limit} or the AGENTRT_BUDGET_* setting",
            limit=limit,
            allowed=str(allowed),
            used=str(used),
        )

    def price(self, provider: str, model: str, model_id: str, usage: TokenUsage) -> CallCost | None:
        """Return the call's cost, or None when the price (or the usage) is unknown."""
        if self.pricer is None or not usage.reported:
            return None
        return self.pricer(provider, model, model_id, usage)

    def add_call(self, usage: TokenUsage, cost: CallCost | None, *, ok: bool) -> RunTotals:
        """Count one model call (a failed one too) and return the new totals."""
        t = self.totals
        t.model_calls += 1
        t.input_tokens += usage.input_tokens
        t.output_tokens += usage.output_tokens
        t.cached_input_tokens += usage.cached_input_tokens
        t.reasoning_tokens += usage.reasoning_tokens
        if not ok:
            t.failed_model_calls += 1
        if cost is not None:
            t.known_cost += cost.total
        elif ok:
            t.unpriced_calls += 1
        return t
