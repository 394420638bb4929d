"""Error answers for database faults and idempotency keys, in the API's JSON error shape."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg import OperationalError
from psycopg_pool import PoolTimeout

from server.runs.idempotency import IdempotencyKeyReusedError, InvalidIdempotencyKeyError

log = logging.getLogger(__name__)

# Long enough for a restarted Postgres to take connections again, short enough to feel live.
RETRY_AFTER_S = 2


def _error(status: int, code: str, message: str, **extra: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


def install_fault_handlers(app: FastAPI) -> None:
    """Answer a database outage 503 with `Retry-After`, and idempotency-key misuse 4xx."""

    @app.exception_handler(OperationalError)
    async def on_database_unavailable(_: Request, exc: OperationalError) -> JSONResponse:
        # Covers lost connections, a database shutting down or starting, pool timeouts, and
        # a deadlock that outlived its retries: all are worth retrying as they are.
        waited = isinstance(exc, PoolTimeout)
        log.warning("database unavailable: %s: %s", type(exc).__name__, exc)
        response = _error(
            503,
            "database_unavailable",
            "the database is unavailable or overloaded"
            + (" (no connection became free in time)" if waited else "")
            + f"; nothing was lost, retry in {RETRY_AFTER_S} s (with the same Idempotency-Key "
            "for a message)",
        )
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response

    @app.exception_handler(InvalidIdempotencyKeyError)
    async def on_bad_key(_: Request, exc: InvalidIdempotencyKeyError) -> JSONResponse:
        return _error(400, "invalid_idempotency_key", str(exc))

    @app.exception_handler(IdempotencyKeyReusedError)
    async def on_key_reused(_: Request, exc: IdempotencyKeyReusedError) -> JSONResponse:
        return _error(422, "idempotency_key_reused", str(exc), runId=exc.run_id)
