"""Prices: the settings' price table first, then litellm's model price map.

Money is `Decimal`. litellm's prices are floats per token; they go through `str` so that
`1.5e-07` becomes exactly `Decimal("1.5E-7")`. No price found means the cost is unknown
(None), never zero; the local `demo` and `scripted` models are free.
"""

from __future__ import annotations

import logging
import os
from decimal import Decimal
from types import ModuleType
from typing import Any

from nodes.models.usage import CallCost, TokenUsage
from server.settings import ModelPrice, Settings

log = logging.getLogger(__name__)

_PER_MILLION = Decimal(1_000_000)
FREE_PROVIDERS = frozenset({"demo", "scripted"})


def load_litellm(settings: Settings) -> ModuleType:
    """Import litellm, with its bundled price map unless the remote one is asked for.

    litellm reads `LITELLM_LOCAL_MODEL_COST_MAP` at import time only, so it is set before
    the first import (which takes seconds: call this from a thread at start-up).
    """
    if not settings.litellm_remote_price_map:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def _decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    return Decimal(str(value))


def cost_of(
    usage: TokenUsage, input_price: Decimal, output_price: Decimal, cached_price: Decimal | None
) -> Decimal:
    """Price a call's tokens.

    Cached input tokens cost the cache price (or the input price), the rest of the input the
    input price, and output tokens (reasoning included) the output price.
    """
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    cached_rate = input_price if cached_price is None else cached_price
    return (
        (usage.input_tokens - cached) * input_price
        + cached * cached_rate
        + usage.output_tokens * output_price
    )


class PriceBook:
    """Price model calls; an instance is the `Pricer` callable handed to the model caller."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._overrides: dict[str, ModelPrice] = dict(settings.model_prices)

    def __call__(
        self, provider: str, model: str, model_id: str, usage: TokenUsage
    ) -> CallCost | None:
        """Return the cost of one call, or None when no price is known for its model."""
        override = self._overrides.get(model_id)
        if override is not None:
            cached = override.cached_input_per_mtok
            return CallCost(
                cost_of(
                    usage,
                    override.input_per_mtok / _PER_MILLION,
                    override.output_per_mtok / _PER_MILLION,
                    None if cached is None else cached / _PER_MILLION,
                ),
                "settings",
            )
        if provider in FREE_PROVIDERS:
            return CallCost(Decimal(0), "local")
        info = self.litellm_price(provider, model)
        if info is None:
            return None
        return CallCost(cost_of(usage, *info), "litellm")

    def litellm_price(
        self, provider: str, model: str
    ) -> tuple[Decimal, Decimal, Decimal | None] | None:
        """Return (input, output, cached input) per token from litellm's map, or None."""
        litellm = load_litellm(self._settings)
        name = model if provider == "litellm" else f"{provider}/{model}"
        try:
            info = litellm.get_model_info(name)
        except Exception:  # litellm raises a bare Exception for an unmapped model
            return None
        input_price = _decimal(info.get("input_cost_per_token"))
        output_price = _decimal(info.get("output_cost_per_token"))
        if input_price is None or output_price is None:
            return None
        return input_price, output_price, _decimal(info.get("cache_read_input_token_cost"))
