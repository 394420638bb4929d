"""A run's failure is named by a `FailureReason`, or by its class when nobody foresaw it."""

from __future__ import annotations

from pathlib import Path

import pytest
from langgraph.errors import GraphRecursionError

from nodes.errors import BudgetExceededError, ModelCallFailedError, StepLimitError
from server.domain import FailureReason
from server.errors import RunTimeoutError
from server.runs.failures import describe_failure, failure_reason

pytestmark = pytest.mark.timeout(30)
ROOT = Path(__file__).resolve().parents[2]


def test_a_foreseen_failure_is_named_by_its_reason_with_its_details() -> None:
    budget = BudgetExceededError("tokens used up", limit="tokens", allowed="10", used="12")
    model = ModelCallFailedError("every model failed", {"errorClass": "timeout", "attempts": 3})
    assert describe_failure(budget) == {
        "errorType": "budget_exceeded",
        "message": "tokens used up",
        "limit": "tokens",
        "allowed": "10",
        "used": "12",
    }
    assert describe_failure(model) == {
        "errorType": "model_call_failed",
        "message": "every model failed",
        "errorClass": "timeout",
        "attempts": 3,
    }
    assert describe_failure(StepLimitError("10 steps")) == {
        "errorType": "step_limit",
        "message": "10 steps",
    }
    assert describe_failure(RunTimeoutError("deadline passed"))["errorType"] == "timeout"


def test_the_graph_recursion_limit_is_a_step_limit_in_our_words() -> None:
    data = describe_failure(GraphRecursionError("Recursion limit of 25 reached"))
    assert data == {
        "errorType": "step_limit",
        "message": "the graph exceeded its recursion limit without finishing",
    }


def test_an_unforeseen_failure_is_named_by_its_class() -> None:
    assert failure_reason(KeyError("x")) is None
    assert describe_failure(ValueError("bad value")) == {
        "errorType": "ValueError",
        "message": "bad value",
    }
    assert describe_failure(RuntimeError())["message"] == "RuntimeError()"


def test_a_subclass_fails_for_the_reason_of_its_parent() -> None:
    class TighterBudgetError(BudgetExceededError):
        pass

    error = TighterBudgetError("x", limit="cost", allowed="1", used="2")
    assert failure_reason(error) is FailureReason.BUDGET_EXCEEDED


def test_every_failure_reason_is_documented_with_run_failed() -> None:
    events = (ROOT / "docs" / "events.md").read_text(encoding="utf-8")
    assert [r.value for r in FailureReason if f"`{r.value}`" not in events] == []
