"""The FastAPI application: wiring of database, graph, notifier, worker and routes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from langchain_core.tools import BaseTool
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from starlette.exceptions import HTTPException as StarletteHTTPException

from graphs.agent import build_agent_graph
from server.db import Pool, migrate, migration_lock, open_pool, resolve_database_url
from server.eventlog import RunFinishedError, RunNotFoundError
from server.executor import ExecutorDeps
from server.models import ModelRegistry, UnknownModelError
from server.notify import Notifier
from server.routes import conversations, health, runs, usage
from server.runs import IllegalTransitionError
from server.settings import Settings
from server.store import ConversationNotFoundError
from server.worker import Worker
from tools.builtin import builtin_tools

log = logging.getLogger("agentrt")


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


def _describe_validation(exc: RequestValidationError) -> tuple[int, str, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = errors[0].get("ctx", {}).get("error", "")
        return 400, "invalid_json", f"the request body is not valid JSON ({detail})"
    parts = []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg')}")
    return 422, "invalid_request", "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every client error as `{"error": {"code", "message"}}` with an actionable message."""

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        status, code, message = _describe_validation(exc)
        return _error(status, code, message)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {
            401: "unauthorized",
            403: "forbidden",
            404: "not_found",
            405: "method_not_allowed",
            409: "conflict",
            413: "too_large",
            422: "invalid_request",
            429: "too_many",
        }
        return _error(exc.status_code, codes.get(exc.status_code, "error"), str(exc.detail))

    @app.exception_handler(RunNotFoundError)
    async def on_run_missing(_: Request, exc: RunNotFoundError) -> JSONResponse:
        return _error(404, "not_found", f"run {exc.args[0]} not found")

    @app.exception_handler(ConversationNotFoundError)
    async def on_conversation_missing(_: Request, exc: ConversationNotFoundError) -> JSONResponse:
        return _error(404, "not_found", f"conversation {exc.args[0]} not found")

    @app.exception_handler(RunFinishedError)
    async def on_finished(_: Request, exc: RunFinishedError) -> JSONResponse:
        return _error(409, "run_finished", str(exc), runStatus=exc.status)

    @app.exception_handler(IllegalTransitionError)
    async def on_illegal(_: Request, exc: IllegalTransitionError) -> JSONResponse:
        return _error(409, "illegal_transition", str(exc))

    @app.exception_handler(UnknownModelError)
    async def on_model(_: Request, exc: UnknownModelError) -> JSONResponse:
        return _error(400, "unknown_model", str(exc))


def redact_url(url: str) -> str:
    """Hide the password in a database URL for logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


async def setup_checkpointer(pool: Pool) -> AsyncPostgresSaver:
    """Create LangGraph's checkpointer on our pool and run its own migrations once."""
    checkpointer = AsyncPostgresSaver(pool)
    async with migration_lock(pool):
        await checkpointer.setup()
    return checkpointer


def create_app(
    settings: Settings,
    *,
    models: ModelRegistry | None = None,
    tools: list[BaseTool] | None = None,
) -> FastAPI:
    """Build the app; database, worker and notifier start in its lifespan.

    Args:
        settings: The process settings.
        models: The model registry (tests inject scripted models here).
        tools: The tools runs may use; the built-in tools by default.
    """
    registry = models or ModelRegistry(settings)
    run_tools = tools if tools is not None else builtin_tools(settings.fetch_allowlist)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = await asyncio.to_thread(resolve_database_url, settings)
        await asyncio.to_thread(registry.warm_up)
        async with open_pool(url, settings) as pool:
            applied = await migrate(pool)
            checkpointer = await setup_checkpointer(pool)
            graph = build_agent_graph().compile(checkpointer=checkpointer)
            notifier = Notifier(url)
            await notifier.start()
            deps = ExecutorDeps(pool, graph, registry, run_tools, settings)
            worker = Worker(deps, notifier) if settings.run_workers else None
            app.state.pool, app.state.notifier, app.state.worker = pool, notifier, worker
            app.state.graph = graph
            if worker is not None:
                await worker.start()
            log.info(
                "agentrt ready: database %s%s, model %s, workers %s",
                redact_url(url),
                " (embedded)" if not settings.database_url else "",
                settings.default_model,
                f"in-process x{settings.worker_concurrency}" if worker else "none (API only)",
            )
            if applied:
                log.info("applied migrations: %s", ", ".join(applied))
            try:
                yield
            finally:
                if worker is not None:
                    await worker.stop()
                await notifier.stop()

    app = FastAPI(title="agentrt", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.models = registry
    install_error_handlers(app)
    for router in (health.router, conversations.router, runs.router, usage.router):
        app.include_router(router)
    return app
