"""Tool failure classes: what went wrong, and whether trying again can help."""

from __future__ import annotations

from typing import Literal

import httpx
from langchain_core.tools import ToolException
from pydantic import ValidationError

ErrorType = Literal[
    "unknown_tool",  # no such tool for this tenant
    "unavailable",  # the tool's provider (an MCP server) cannot be reached
    "invalid_arguments",  # the arguments do not match the input schema
    "forbidden",  # the tenant or the run may not use this tool
    "permission_denied",  # the caller lacks a permission the tool requires
    "rejected",  # a reviewer rejected the call
    "timeout",  # the execution did not finish in time
    "connection",  # network or transport failure
    "rate_limited",  # the outside service said 429
    "server_error",  # the outside service failed (5xx)
    "retryable",  # the tool raised RetryableToolError
    "tool_error",  # the tool reported a failure (ToolException)
    "invalid_output",  # the result does not match the declared output schema
    "outcome_unknown",  # a non-rerunnable execution was interrupted; it may have happened
    "error",  # any other exception
]
RETRYABLE: frozenset[str] = frozenset(
    {"timeout", "connection", "rate_limited", "server_error", "retryable", "unavailable"}
)


class RetryableToolError(Exception):
    """Raise from a tool to report a transient failure worth retrying."""


class ToolCallError(Exception):
    """A failure the pipeline reports to the model as the call's result."""

    def __init__(self, error_type: ErrorType, message: str) -> None:
        super().__init__(message)
        self.error_type: ErrorType = error_type
        self.message = message


def _walk(exc: BaseException) -> list[BaseException]:
    """Flatten exception groups (anyio task groups in MCP transports wrap the real error)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _walk(inner)]
    return [exc]


def error_type_of(exc: BaseException) -> ErrorType:
    """Name the failure class of an exception raised while executing a tool."""
    for leaf in _walk(exc):
        if isinstance(leaf, ToolCallError):
            return leaf.error_type
        if isinstance(leaf, TimeoutError | httpx.TimeoutException):
            return "timeout"
        if isinstance(leaf, RetryableToolError):
            return "retryable"
        if isinstance(leaf, httpx.HTTPStatusError):
            code = leaf.response.status_code
            if code == 429:
                return "rate_limited"
            return "server_error" if code >= 500 else "tool_error"
        if isinstance(leaf, httpx.TransportError | ConnectionError):
            return "connection"
        if isinstance(leaf, PermissionError):
            return "permission_denied"
        if isinstance(leaf, ValidationError):
            return "invalid_arguments"
        if isinstance(leaf, ToolException):
            return "tool_error"
    return "error"


def describe(exc: BaseException) -> str:
    """Return a one-line message for an exception, unwrapping exception groups.

    A NUL character becomes U+FFFD: the message is stored in Postgres, which refuses it.
    """
    leaves = _walk(exc)
    parts = [str(leaf) or type(leaf).__name__ for leaf in leaves]
    return "; ".join(dict.fromkeys(parts)).replace("\x00", "\ufffd")
