"""Every error answered as `{"error": {"code", "message", ...}}` with a message to act on.

Our own errors (`server/errors.py`) carry their status and code and share one handler; the
others are the framework's (validation, HTTP errors), the database's (an outage answers 503
with `Retry-After`) and anything unexpected (500 with a request id, no internals).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg import OperationalError
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from server.errors import AgentrtError
from server.ids import new_id

log = logging.getLogger("server.app")

# Long enough for a restarted Postgres to take connections again, short enough to feel live.
RETRY_AFTER_S = 2
# The code of an HTTP error raised by the framework (or a route), by status.
HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    422: "invalid_request",
    429: "too_many",
}
Handler = Callable[[Request, Any], Awaitable[JSONResponse]]


def error_response(
    status: int, code: str, message: str, *, retry_after_s: int | None = None, **fields: Any
) -> JSONResponse:
    """Return the JSON error answer; `fields` join `code` and `message` (e.g. `runId`)."""
    # A message may quote input; a lone surrogate in it would make the JSON unencodable.
    message = message.encode("utf-8", "backslashreplace").decode()
    response = JSONResponse(
        {"error": {"code": code, "message": message, **fields}}, status_code=status
    )
    if retry_after_s is not None:
        response.headers["Retry-After"] = str(retry_after_s)
    return response


def answer(exc: AgentrtError) -> JSONResponse:
    """Return the answer to one of our 4xx errors: its status, code, message and fields."""
    return error_response(
        exc.status, exc.code, exc.message, retry_after_s=exc.retry_after_s, **exc.fields
    )


async def on_agentrt_error(request: Request, exc: AgentrtError) -> JSONResponse:
    """Answer one of our errors; a 5xx one like an unexpected fault, without its message."""
    if exc.status >= 500:
        return await on_unexpected(request, exc)
    return answer(exc)


async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Answer a request that failed validation, naming every bad field."""
    errors = exc.errors()
    if errors and all((e.get("loc") or ("",))[0] == "path" for e in errors):
        # A path another route names literally (`/documents/from-url` against
        # `/documents/{document_id}`): that resource, which this method is not.
        methods = allowed_methods(request)
        if methods and request.method not in methods:
            response = error_response(
                405,
                "method_not_allowed",
                f"{request.method} is not served at {request.url.path}; use {', '.join(methods)}",
            )
            response.headers["Allow"] = ", ".join(methods)
            return response
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = errors[0].get("ctx", {}).get("error", "")
        return error_response(400, "invalid_json", f"the request body is not valid JSON ({detail})")
    parts = []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        message = str(e.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return error_response(422, "invalid_request", "; ".join(parts))


def _parse_failure(cause: BaseException) -> str:
    if isinstance(cause, RecursionError):
        return "the request body is not valid JSON (it nests too deeply)"
    return f"the request body could not be read as JSON ({type(cause).__name__})"


_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def allowed_methods(request: Request) -> list[str]:
    """The methods the request's path serves, from the OpenAPI document.

    The framework's 405 names only the methods of the first route whose path matched, where
    each method of a path is a route of its own. A path that two templates match (say
    `/threads/{id}/state/checkpoint` and `/threads/{id}/state/{checkpoint_id}`) is the
    resource of the one with fewer parameters.
    """
    found: tuple[int, set[str]] | None = None
    for template, item in request.app.openapi().get("paths", {}).items():
        if compile_path(template)[0].match(request.url.path):
            params = template.count("{")
            if found is None or params < found[0]:
                found = (params, set())
            if params == found[0]:
                found[1].update(m.upper() for m in item if m in _METHODS)
    return sorted(found[1]) if found else []


def http_error_handler(max_body_bytes: int) -> Handler:
    """Return the handler of the framework's HTTP errors, which names the body size limit."""

    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI turns any failure to parse the body into a bare 400; say why.
            return error_response(400, "invalid_json", _parse_failure(exc.__cause__))
        if exc.status_code == 413 and exc.detail == "Content Too Large":
            return error_response(
                413,
                "too_large",
                f"the request body is too large; the limit is {max_body_bytes} bytes "
                "(AGENTRT_MAX_BODY_BYTES)",
            )
        code = HTTP_CODES.get(exc.status_code, "error")
        response = error_response(exc.status_code, code, str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405 and (methods := allowed_methods(request)):
            response.headers["Allow"] = ", ".join(methods)
        return response

    return on_http


async def on_database_unavailable(_: Request, exc: OperationalError) -> JSONResponse:
    """Answer a database outage 503 with `Retry-After`: nothing was lost, retry as is."""
    # Covers lost connections, a database shutting down or starting, pool timeouts, and
    # a deadlock that outlived its retries: all are worth retrying as they are.
    waited = isinstance(exc, PoolTimeout)
    log.warning("database unavailable: %s: %s", type(exc).__name__, exc)
    return error_response(
        503,
        "database_unavailable",
        "the database is unavailable or overloaded"
        + (" (no connection became free in time)" if waited else "")
        + f"; nothing was lost, retry in {RETRY_AFTER_S} s (with the same Idempotency-Key "
        "for a message)",
        retry_after_s=RETRY_AFTER_S,
    )


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    """Log the fault under a new request id and answer 500 without internals."""
    request_id = new_id("req")
    log.error(
        "unexpected error in %s %s (request %s)",
        request.method,
        request.url.path,
        request_id,
        exc_info=exc,
    )
    return error_response(
        500,
        "internal_error",
        f"the server failed unexpectedly; the logs have the details under request id {request_id}",
        requestId=request_id,
    )


def install_error_handlers(app: FastAPI, max_body_bytes: int) -> None:
    """Answer every error of `app` in the API's JSON error shape."""
    handlers: dict[type[Exception], Handler] = {
        AgentrtError: on_agentrt_error,
        RequestValidationError: on_validation,
        StarletteHTTPException: http_error_handler(max_body_bytes),
        OperationalError: on_database_unavailable,
        Exception: on_unexpected,
    }
    for exc_class, handler in handlers.items():
        app.add_exception_handler(exc_class, handler)
