"""Errors raised by nodes that end the run; the server names the reason of each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RunEndingError(RuntimeError):
    """A failure that ends the run; `details` join the message in its `run.failed` event."""

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = dict(details or {})


class StepLimitError(RunEndingError):
    """The run made `max_steps` model calls without reaching an answer."""


class BudgetExceededError(RunEndingError):
    """The run used up one of its budgets (tokens, cost or model calls)."""

    def __init__(self, message: str, *, limit: str, allowed: str, used: str) -> None:
        super().__init__(message, {"limit": limit, "allowed": allowed, "used": used})


class ModelCallFailedError(RunEndingError):
    """A model call failed for good: not retryable, or every attempt and fallback failed.

    `details` says why: the last error class, provider, model and status code, how many
    attempts were made, and every model tried.
    """


class ContextOverflowError(RunEndingError):
    """What must be sent (instructions and the current turn) does not fit the model's window."""
