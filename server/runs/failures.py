"""Why a run failed: the `run.failed` data for the exception that ended it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.errors import GraphRecursionError

from nodes.errors import (
    BudgetExceededError,
    ContextOverflowError,
    ModelCallFailedError,
    RunEndingError,
    StepLimitError,
)
from server.domain import FailureReason
from server.errors import RunTimeoutError

# The reason of each failure we foresee, by exception class (subclasses included).
REASONS: Mapping[type[BaseException], FailureReason] = {
    StepLimitError: FailureReason.STEP_LIMIT,
    GraphRecursionError: FailureReason.STEP_LIMIT,
    BudgetExceededError: FailureReason.BUDGET_EXCEEDED,
    ModelCallFailedError: FailureReason.MODEL_CALL_FAILED,
    RunTimeoutError: FailureReason.TIMEOUT,
    ContextOverflowError: FailureReason.CONTEXT_OVERFLOW,
}
# LangGraph's own message names its setting, which our users do not set.
RECURSION_MESSAGE = "the graph exceeded its recursion limit without finishing"


def failure_reason(exc: BaseException) -> FailureReason | None:
    """Return the reason `exc` ends a run for, or None for a fault nobody foresaw."""
    return next((REASONS[cls] for cls in type(exc).__mro__ if cls in REASONS), None)


def describe_failure(exc: BaseException) -> dict[str, Any]:
    """Return the `run.failed` data for `exc`: `errorType`, a message to act on, details.

    A failed model call details its error class, provider, model, attempts and last status
    code; an exhausted budget names the limit, what it allowed and what was used. A fault
    nobody foresaw is named by its exception class.
    """
    reason = failure_reason(exc)
    if reason is None:
        return {"errorType": type(exc).__name__, "message": str(exc) or repr(exc)}
    message = RECURSION_MESSAGE if isinstance(exc, GraphRecursionError) else str(exc)
    details = exc.details if isinstance(exc, RunEndingError) else {}
    return {"errorType": reason.value, "message": message, **details}
