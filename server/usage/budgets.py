"""A run's budget: the settings' limits, lowered (never raised) by the run's options."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from nodes.models.usage import Budget
from server.settings import Settings


def _tightest(*values: Any) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def run_budget(options: dict[str, Any], settings: Settings) -> Budget:
    """Return the run's budget: its options may lower the settings' limits, never raise them."""
    cost = options.get("maxCost")
    return Budget(
        max_tokens=_tightest(options.get("maxTokens"), settings.budget_max_tokens),
        max_cost=_tightest(None if cost is None else Decimal(str(cost)), settings.budget_max_cost),
        max_model_calls=_tightest(options.get("maxModelCalls"), settings.budget_max_model_calls),
    )
