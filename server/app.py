"""The FastAPI application: wiring of database, graph, notifier, worker and routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from langchain_core.tools import BaseTool
from opentelemetry.sdk.trace.export import SpanExporter
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.agents.errors import AgentError
from server.domain import IllegalTransitionError
from server.errors import install_fault_handlers
from server.events.log import RunFinishedError, RunNotFoundError
from server.events.sse import Feeds
from server.ids import new_id
from server.memory.service import MemoryApiError
from server.process import open_runtime
from server.routes import (
    admin,
    agents,
    approvals,
    context,
    conversations,
    health,
    observability,
    runs,
    usage,
)
from server.routes import memory as memory_routes
from server.routes import tools as tools_routes
from server.routes.guards import RequestGuard
from server.routes.schemas import errors
from server.runs.approvals import (
    ApprovalDecidedError,
    ApprovalForbiddenError,
    ApprovalNotFoundError,
)
from server.runs.pages import BadCursorError
from server.runs.pausing import RunForbiddenError, RunNotPausedError
from server.runs.records import ConversationBusyError, ConversationNotFoundError, TooManyRunsError
from server.runs.toolbox import ToolConfigError
from server.settings import Settings
from server.usage.registry import ModelRegistry, UnknownModelError
from tools.builtin import builtin_tools, load_tool_modules
from tools.mcp import McpCatalog
from tools.memory.tools import memory_tools
from tools.registry import ToolRegistry
from tools.spec import ToolSpec

log = logging.getLogger(__name__)


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    # A message may quote input; a lone surrogate in it would make the JSON unencodable.
    message = message.encode("utf-8", "backslashreplace").decode()
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


def _describe_validation(exc: RequestValidationError) -> tuple[int, str, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = errors[0].get("ctx", {}).get("error", "")
        return 400, "invalid_json", f"the request body is not valid JSON ({detail})"
    parts = []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        message = str(e.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return 422, "invalid_request", "; ".join(parts)


def _parse_failure(cause: BaseException) -> str:
    if isinstance(cause, RecursionError):
        return "the request body is not valid JSON (it nests too deeply)"
    return f"the request body could not be read as JSON ({type(cause).__name__})"


def _too_large(limit: int) -> str:
    return f"the request body is too large; the limit is {limit} bytes (AGENTRT_MAX_BODY_BYTES)"


def install_error_handlers(app: FastAPI, max_body_bytes: int) -> None:
    """Answer every error as `{"error": {"code", "message"}}` with an actionable message.

    Unexpected exceptions are logged with a request id and answered 500 without internals.
    """

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        status, code, message = _describe_validation(exc)
        return _error(status, code, message)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI turns any failure to parse the body into a bare 400; say why.
            return _error(400, "invalid_json", _parse_failure(exc.__cause__))
        if exc.status_code == 413 and exc.detail == "Content Too Large":
            return _error(413, "too_large", _too_large(max_body_bytes))
        codes = {
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
        return _error(exc.status_code, codes.get(exc.status_code, "error"), str(exc.detail))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = new_id("req")
        log.error(
            "unexpected error in %s %s (request %s)",
            request.method,
            request.url.path,
            request_id,
            exc_info=exc,
        )
        return _error(
            500,
            "internal_error",
            f"the server failed unexpectedly; the logs have the details under request id "
            f"{request_id}",
            requestId=request_id,
        )

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

    @app.exception_handler(ConversationBusyError)
    async def on_busy(_: Request, exc: ConversationBusyError) -> JSONResponse:
        return _error(409, "conversation_busy", str(exc), runId=exc.run_id)

    @app.exception_handler(TooManyRunsError)
    async def on_too_many(_: Request, exc: TooManyRunsError) -> JSONResponse:
        response = _error(429, "too_many_runs", str(exc))
        response.headers["Retry-After"] = "5"
        return response

    @app.exception_handler(UnknownModelError)
    async def on_model(_: Request, exc: UnknownModelError) -> JSONResponse:
        return _error(400, "unknown_model", str(exc))

    @app.exception_handler(ApprovalNotFoundError)
    async def on_approval_missing(_: Request, exc: ApprovalNotFoundError) -> JSONResponse:
        return _error(404, "not_found", f"approval {exc.args[0]} not found")

    @app.exception_handler(ApprovalForbiddenError)
    async def on_approval_forbidden(_: Request, exc: ApprovalForbiddenError) -> JSONResponse:
        return _error(403, "forbidden", str(exc))

    @app.exception_handler(ApprovalDecidedError)
    async def on_approval_decided(_: Request, exc: ApprovalDecidedError) -> JSONResponse:
        return _error(409, "already_decided", str(exc), approvalStatus=exc.status)

    @app.exception_handler(RunForbiddenError)
    async def on_run_forbidden(_: Request, exc: RunForbiddenError) -> JSONResponse:
        return _error(403, "forbidden", str(exc))

    @app.exception_handler(RunNotPausedError)
    async def on_not_paused(_: Request, exc: RunNotPausedError) -> JSONResponse:
        return _error(409, "not_paused", str(exc), runStatus=exc.status)

    @app.exception_handler(BadCursorError)
    async def on_bad_cursor(_: Request, exc: BadCursorError) -> JSONResponse:
        return _error(422, "invalid_cursor", str(exc))

    @app.exception_handler(AgentError)
    async def on_agent(_: Request, exc: AgentError) -> JSONResponse:
        return _error(exc.status, exc.code, str(exc))

    @app.exception_handler(MemoryApiError)
    async def on_memory(_: Request, exc: MemoryApiError) -> JSONResponse:
        return _error(exc.status, exc.code, str(exc))

    @app.exception_handler(ToolConfigError)
    async def on_tool_config(_: Request, exc: ToolConfigError) -> JSONResponse:
        return _error(422, "invalid_tool_config", str(exc))


def default_tools(settings: Settings) -> list[BaseTool | ToolSpec]:
    """The built-in tools, the memory tools, and those named in `AGENTRT_TOOL_MODULES`."""
    return [
        *builtin_tools(settings.fetch_allowlist),
        *memory_tools(),
        *load_tool_modules(settings.tool_modules),
    ]


def build_tool_registry(
    settings: Settings,
    tools: Sequence[ToolSpec | BaseTool] | None = None,
    mcp: McpCatalog | None = None,
) -> ToolRegistry:
    """The tool registry of this process: Python tools plus tenants' MCP servers."""
    return ToolRegistry(
        tools if tools is not None else default_tools(settings),
        settings.tool_config,
        mcp or McpCatalog(ttl_s=settings.mcp_discovery_ttl_s),
        default_timeout_s=settings.tool_timeout_s,
        max_output_chars=settings.tool_max_output_chars,
    )


def create_app(
    settings: Settings,
    *,
    models: ModelRegistry | None = None,
    tools: Sequence[ToolSpec | BaseTool] | None = None,
    mcp: McpCatalog | None = None,
    span_exporters: Sequence[SpanExporter] = (),
) -> FastAPI:
    """Build the app; database, worker and notifier start in its lifespan.

    Args:
        settings: The process settings.
        models: The model registry (tests inject scripted models here).
        tools: The Python tools runs may use (tenants' MCP tools come on top); the built-in
            tools by default.
        mcp: The MCP discovery cache (tests inject one with short timings).
        span_exporters: Extra OpenTelemetry exporters (tests pass an in-memory one).
    """
    registry = models or ModelRegistry(settings)
    tool_registry = build_tool_registry(settings, tools, mcp)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_runtime(
            settings,
            registry,
            tool_registry,
            run_workers=settings.run_workers,
            span_exporters=span_exporters,
        ) as runtime:
            app.state.runtime = runtime
            app.state.pool, app.state.notifier = runtime.pool, runtime.notifier
            app.state.worker, app.state.graph = runtime.worker, runtime.graph
            app.state.feeds = Feeds(runtime.pool, settings.sse_feed_keep)
            yield

    app = FastAPI(
        title="agentrt",
        version="0.1.0",
        lifespan=lifespan,
        responses=errors(500),
    )
    app.state.settings = settings
    app.state.models = registry
    app.state.tools = tool_registry
    app.add_middleware(RequestGuard, max_body_bytes=settings.max_body_bytes)
    install_error_handlers(app, settings.max_body_bytes)
    install_fault_handlers(app)
    for router in (
        health.router,
        conversations.router,
        runs.router,
        approvals.router,
        tools_routes.router,
        admin.router,
        observability.router,
        usage.router,
        agents.router,
        context.router,
        memory_routes.router,
    ):
        app.include_router(router)
    return app
