"""Model API faults: one error type with a class, and the rule for which classes are retried.

Providers fail in many shapes (the `openai` SDK's status errors, litellm's subclasses of them,
raw `httpx` errors from a stream that broke, JSON that does not parse). `classify` turns any of
them into a `ModelCallError` whose `error_class` decides the policy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

import openai


class ModelErrorClass(StrEnum):
    """Why a model call failed; the first group is retryable."""

    TIMEOUT = "timeout"
    TTFT_TIMEOUT = "ttft_timeout"
    CONNECTION = "connection"
    RATE_LIMITED = "rate_limited"
    CONFLICT = "conflict"
    SERVER_ERROR = "server_error"
    BAD_RESPONSE = "bad_response"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    CONTENT_FILTER = "content_filter"
    AUTHENTICATION = "authentication"
    PERMISSION_DENIED = "permission_denied"
    NOT_FOUND = "not_found"
    CIRCUIT_OPEN = "circuit_open"
    UNKNOWN = "unknown"


E = ModelErrorClass
RETRYABLE = frozenset(
    {E.TIMEOUT, E.TTFT_TIMEOUT, E.CONNECTION, E.RATE_LIMITED, E.CONFLICT, E.SERVER_ERROR}
    | {E.BAD_RESPONSE}
)
_CONTEXT_HINTS = ("context_length_exceeded", "maximum context length", "context window")
_FILTER_HINTS = ("content_filter", "content_policy", "content management policy")


class ModelCallError(Exception):
    """One failed model call, classified.

    Attributes:
        error_class: Why it failed; decides retry, breaker and fallback.
        provider: The provider of the model called (`openai`, `litellm`...).
        model: The provider's model name.
        status_code: The HTTP status the provider answered, when it answered.
        retry_after_s: The delay the provider asked for (`Retry-After`), if any.
    """

    def __init__(
        self,
        error_class: ModelErrorClass,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.provider = provider
        self.model = model
        self.status_code = status_code
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        """Say whether another attempt may succeed (timeouts, connection, 408/409/429, 5xx)."""
        return self.error_class in RETRYABLE

    def describe(self) -> dict[str, Any]:
        """Return the fields a `run.failed` event or a ledger row records."""
        return {
            "errorClass": self.error_class.value,
            "provider": self.provider,
            "model": self.model,
            "statusCode": self.status_code,
            "message": self.message,
        }


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Read the delay a server asked for: `retry-after-ms`, then `Retry-After` (s or a date)."""
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def class_for_status(status: int, text: str) -> ModelErrorClass:
    """Map an HTTP status (and the error text, for 400s) to an error class."""
    lowered = text.lower()
    if status in (400, 413, 422):
        if any(h in lowered for h in _CONTEXT_HINTS) or status == 413:
            return E.CONTEXT_LENGTH_EXCEEDED
        if any(h in lowered for h in _FILTER_HINTS):
            return E.CONTENT_FILTER
        return E.INVALID_REQUEST
    fixed = {401: E.AUTHENTICATION, 403: E.PERMISSION_DENIED, 404: E.NOT_FOUND}
    fixed |= {408: E.TIMEOUT, 409: E.CONFLICT, 429: E.RATE_LIMITED}
    if status in fixed:
        return fixed[status]
    if status >= 500:
        return E.SERVER_ERROR
    return E.INVALID_REQUEST


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _mro_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def classify(exc: BaseException, *, provider: str, model: str) -> ModelCallError:
    """Turn whatever a provider adapter raised into a classified `ModelCallError`."""
    if isinstance(exc, ModelCallError):
        return exc
    message = str(exc) or type(exc).__name__
    names = _mro_names(exc)
    original = getattr(exc, "original_exception", None)
    if "MidStreamFallbackError" in names and isinstance(original, BaseException):
        # litellm wraps whatever broke a stream; the wrapped error says what it was.
        exc, names = original, _mro_names(original)
    if any(isinstance(e, json.JSONDecodeError) for e in _chain(exc)):
        return ModelCallError(E.BAD_RESPONSE, message, provider=provider, model=model)

    def made(error_class: ModelErrorClass, **kw: Any) -> ModelCallError:
        return ModelCallError(error_class, message, provider=provider, model=model, **kw)

    if "ContextWindowExceededError" in names:
        return made(E.CONTEXT_LENGTH_EXCEEDED, status_code=_status(exc))
    if "ContentPolicyViolationError" in names:
        return made(E.CONTENT_FILTER, status_code=_status(exc))
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        text = f"{message} {json.dumps(exc.body) if exc.body is not None else ''}"
        headers = exc.response.headers if exc.response is not None else None
        return made(
            class_for_status(status, text),
            status_code=status,
            retry_after_s=parse_retry_after(headers),
        )
    # Errors raised while reading a stream come straight from the HTTP client: `httpx` for
    # litellm, `httpx2` for the openai SDK; both name their classes alike.
    if isinstance(exc, openai.APITimeoutError | TimeoutError) or "TimeoutException" in names:
        return made(E.TIMEOUT)
    if isinstance(exc, openai.APIResponseValidationError | json.JSONDecodeError):
        return made(E.BAD_RESPONSE)
    if "No generation chunks were returned" in message:
        return made(E.BAD_RESPONSE)
    if isinstance(exc, openai.APIConnectionError | ConnectionError) or "TransportError" in names:
        return made(E.CONNECTION)
    code = _status(exc)
    if code is not None and code >= 400:
        return made(class_for_status(code, message), status_code=code)
    return made(E.UNKNOWN)
