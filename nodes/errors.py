"""Errors raised by nodes that end a run with a named reason."""

from __future__ import annotations

from typing import Any


class StepLimitError(RuntimeError):
    """The run made `max_steps` model calls without reaching an answer."""

    reason = "step_limit"


class BudgetExceededError(RuntimeError):
    """The run used up one of its budgets (tokens, cost or model calls)."""

    reason = "budget_exceeded"

    def __init__(self, message: str, *, limit: str, allowed: str, used: str) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = {"limit": limit, "allowed": allowed, "used": used}


class ModelCallFailedError(RuntimeError):
    """A model call failed for good: not retryable, or every attempt and fallback failed.

    `details` says why: the last error class, provider, model and status code, how many
    attempts were made, and every model tried.
    """

    reason = "model_call_failed"

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.details = details


class ContextOverflowError(RuntimeError):
    """What must be sent (instructions and the current turn) does not fit the model's window."""

    reason = "context_overflow"
