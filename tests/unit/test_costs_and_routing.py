"""Prices in Decimal, unknown prices, budgets and model routing."""

from __future__ import annotations

from decimal import Decimal

import pytest

from nodes.errors import BudgetExceededError
from nodes.models.usage import Budget, CallCost, RunTotals, TokenUsage, UsageMeter
from server.settings import ModelPrice, RouteRule, Settings
from server.usage.budgets import run_budget
from server.usage.pricing import PriceBook as Pricer
from server.usage.pricing import cost_of
from server.usage.routing import pick_model


def settings(**kw: object) -> Settings:
    return Settings(_env_file=None, **kw)  # type: ignore[arg-type]


USAGE = TokenUsage(input_tokens=1000, output_tokens=300, cached_input_tokens=600, reported=True)


def test_cost_is_exact_decimal_with_cached_tokens_at_their_price() -> None:
    cost = cost_of(USAGE, Decimal("1.5E-7"), Decimal("6E-7"), Decimal("7.5E-8"))
    # 400 x 0.00000015 + 600 x 0.000000075 + 300 x 0.0000006
    assert cost == Decimal("0.000285")
    assert cost_of(USAGE, Decimal("1E-6"), Decimal("2E-6"), None) == Decimal("0.0016")


def test_settings_price_wins_and_local_models_are_free() -> None:
    price = ModelPrice(input_per_mtok=Decimal("1"), output_per_mtok=Decimal("2"))
    pricer = Pricer(settings(model_prices={"scripted:x": price}))
    assert pricer("scripted", "x", "scripted:x", USAGE) == CallCost(Decimal("0.0016"), "settings")
    assert pricer("demo", "demo", "demo", USAGE) == CallCost(Decimal(0), "local")


def test_meter_keeps_unknown_cost_unknown() -> None:
    meter = UsageMeter(pricer=lambda *a: None)
    totals = meter.add_call(USAGE, meter.price("openai", "m", "openai:m", USAGE), ok=True)
    assert totals.cost is None and totals.known_cost == 0 and totals.unpriced_calls == 1
    meter.add_call(TokenUsage(), None, ok=False)  # a failed call adds no unknown cost
    assert totals.unpriced_calls == 1 and totals.failed_model_calls == 1
    assert totals.to_json()["cost"] is None and totals.to_json()["knownCost"] == "0"


def test_totals_survive_a_round_trip_through_json() -> None:
    totals = RunTotals(input_tokens=5, output_tokens=7, known_cost=Decimal("0.000123"))
    totals.model_calls, totals.tool_calls = 2, 3
    again = RunTotals.from_json(totals.to_json())
    assert again == totals and again.to_json()["knownCost"] == "0.000123"


@pytest.mark.parametrize(
    ("budget", "limit"),
    [
        (Budget(max_tokens=1300), "maxTokens"),
        (Budget(max_cost=Decimal("0.001")), "maxCost"),
        (Budget(max_model_calls=1), "maxModelCalls"),
    ],
)
def test_each_budget_refuses_the_next_call(budget: Budget, limit: str) -> None:
    meter = UsageMeter(budget=budget)
    meter.check_budget()
    meter.add_call(USAGE, CallCost(Decimal("0.002"), "settings"), ok=True)
    with pytest.raises(BudgetExceededError) as info:
        meter.check_budget()
    assert info.value.details["limit"] == limit


def test_run_options_can_lower_budgets_but_not_raise_them() -> None:
    s = settings(budget_max_tokens=1000, budget_max_cost=Decimal("0.50"))
    budget = run_budget({"maxTokens": 5000, "maxCost": "0.10", "maxModelCalls": 4}, s)
    assert budget == Budget(max_tokens=1000, max_cost=Decimal("0.10"), max_model_calls=4)
    assert run_budget({}, settings()) == Budget()


def test_routing_explicit_beats_conversation_beats_rules_beats_default() -> None:
    rules = [
        RouteRule(model="litellm:openai/o3", needs=["reasoning"]),
        RouteRule(model="openai:gpt-4o", min_chars=100),
        RouteRule(model="openai:gpt-4o-mini", max_chars=99),
    ]

    def pick(**kw: object) -> tuple[str, str]:
        args = {"requested": None, "conversation_model": None, "text": "hi", "needs": []}
        p = pick_model(**{**args, **kw}, rules=rules, default="demo")  # type: ignore[arg-type]
        return p.model_id, p.source

    assert pick(requested="openai:x", conversation_model="openai:y") == ("openai:x", "request")
    assert pick(conversation_model="openai:y") == ("openai:y", "conversation")
    assert pick(needs=["reasoning", "vision"]) == ("litellm:openai/o3", "rule:0")
    assert pick(text="x" * 150) == ("openai:gpt-4o", "rule:1")
    assert pick() == ("openai:gpt-4o-mini", "rule:2")
    assert (
        pick_model(
            requested=None, conversation_model=None, text="hi", needs=[], rules=[], default="demo"
        ).source
        == "default"
    )
