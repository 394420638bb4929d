"""The FastAPI application: wiring of database, graph, notifier, worker and routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from langchain_core.tools import BaseTool
from opentelemetry.sdk.trace.export import SpanExporter

from server.events.sse import Feeds
from server.process import open_runtime
from server.routes import (
    admin,
    agents,
    approvals,
    context,
    conversations,
    health,
    lg_assistants,
    lg_crons,
    lg_runs,
    lg_store,
    lg_threads,
    observability,
    runs,
    subagents,
    usage,
)
from server.routes import artifacts as artifact_routes
from server.routes import console as console_routes
from server.routes import knowledge as knowledge_routes
from server.routes import lifecycle as lifecycle_routes
from server.routes import memory as memory_routes
from server.routes import skills as skills_routes
from server.routes import tools as tools_routes
from server.routes.errors import install_error_handlers
from server.routes.guards import RequestGuard
from server.routes.schemas import errors, errors_as_json
from server.runs.memo import PostMemo
from server.settings import Settings
from server.usage.registry import ModelRegistry
from skills.tools import load_skill, read_skill_resource
from tools.artifacts.tools import artifact_tools
from tools.builtin import builtin_tools, load_tool_modules
from tools.delegate import delegate_tools
from tools.knowledge.tools import knowledge_tools
from tools.mcp import McpCatalog
from tools.memory.tools import memory_tools
from tools.plan.tool import update_plan
from tools.registry import ToolRegistry
from tools.spec import ToolSpec


def default_tools(settings: Settings) -> list[BaseTool | ToolSpec]:
    """The built-in, memory and subagent tools, and those named in `AGENTRT_TOOL_MODULES`."""
    return [
        *builtin_tools(settings.fetch_allowlist),
        *memory_tools(),
        *artifact_tools(),
        *delegate_tools(),
        *knowledge_tools(),
        *load_tool_modules(settings.tool_modules),
        load_skill,
        read_skill_resource,
        update_plan,
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
            app.state.feeds = Feeds(runtime.pool, settings.sse_feed_keep, runtime.notifier)
            app.state.post_memo = PostMemo()
            yield

    app = FastAPI(
        title="agentrt",
        version="0.1.0",
        lifespan=lifespan,
        responses=errors(500),
    )

    def openapi() -> dict[str, Any]:
        return app.openapi_schema or errors_as_json(FastAPI.openapi(app))

    app.openapi = openapi  # type: ignore[method-assign]
    app.state.settings = settings
    app.state.models = registry
    app.state.tools = tool_registry
    app.add_middleware(RequestGuard, max_body_bytes=settings.max_body_bytes)
    install_error_handlers(app, settings.max_body_bytes)
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
        artifact_routes.router,
        skills_routes.router,
        subagents.router,
        lifecycle_routes.router,
        lg_assistants.router,
        lg_threads.router,
        lg_crons.router,
        lg_runs.router,
        lg_store.router,
        knowledge_routes.router,
        knowledge_routes.evidence_router,
        console_routes.router,
        console_routes.pages,
    ):
        app.include_router(router)
    app.mount("/console", console_routes.console_files(), name="console")
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Location", "Content-Location", "X-Pagination-Next"],
        )
    return app
