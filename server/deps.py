"""What routes may ask for: the process's parts and the caller, as `Annotated` dependencies.

This is the one reader of `app.state` besides the app that fills it, so a route names what
it needs in its signature (`pool: PoolDep`) and tests can see it there. The getters are
`async def` although they never wait: FastAPI runs a plain `def` dependency on a thread.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.artifacts.service import ArtifactService
from server.auth import Principal, presented_key, principal_of
from server.db.pool import Pool
from server.errors import MemoryUnavailableError
from server.events.notify import Notifier
from server.events.sse import RunStreams
from server.knowledge.service import KnowledgeService
from server.langgraph_api.auth import GraphAuth
from server.langgraph_api.service import LangGraphService
from server.memory.service import MemoryService
from server.observability.metrics import Metrics
from server.observability.tracing import Tracing
from server.runs.service import RunService
from server.settings import Settings
from server.skills.service import SkillService
from server.subagents.service import SubagentService
from server.usage.registry import ModelRegistry
from tools.registry import ToolRegistry


async def get_settings(request: Request) -> Settings:
    """Return the process settings."""
    settings: Settings = request.app.state.settings
    return settings


async def get_pool(request: Request) -> Pool:
    """Return the process's connection pool."""
    pool: Pool = request.app.state.pool
    return pool


async def get_models(request: Request) -> ModelRegistry:
    """Return the model registry."""
    models: ModelRegistry = request.app.state.models
    return models


async def get_tools(request: Request) -> ToolRegistry:
    """Return the tool registry."""
    tools: ToolRegistry = request.app.state.tools
    return tools


async def get_notifier(request: Request) -> Notifier:
    """Return the process's LISTEN connection."""
    notifier: Notifier = request.app.state.notifier
    return notifier


async def get_metrics(request: Request) -> Metrics:
    """Return the process's Prometheus metrics."""
    metrics: Metrics = request.app.state.runtime.metrics
    return metrics


async def get_tracing(request: Request) -> Tracing:
    """Return the process's tracer and span sink."""
    tracing: Tracing = request.app.state.runtime.tracing
    return tracing


async def get_run_streams(request: Request) -> RunStreams:
    """Return what a route needs to stream a run's events (one dependency, not six)."""
    state = request.app.state
    return RunStreams(
        pool=state.pool,
        notifier=state.notifier,
        feeds=state.feeds,
        heartbeat_s=state.settings.sse_heartbeat_s,
        page=state.settings.sse_replay_page,
        connections=state.runtime.metrics.sse_connections,
        stop=state.runtime.stopping,
    )


SettingsDep = Annotated[Settings, Depends(get_settings)]
PoolDep = Annotated[Pool, Depends(get_pool)]
ModelsDep = Annotated[ModelRegistry, Depends(get_models)]
ToolsDep = Annotated[ToolRegistry, Depends(get_tools)]
NotifierDep = Annotated[Notifier, Depends(get_notifier)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
TracingDep = Annotated[Tracing, Depends(get_tracing)]
RunStreamsDep = Annotated[RunStreams, Depends(get_run_streams)]


async def get_principal(request: Request) -> Principal:
    """Resolve the caller from its API key; 401 when auth is on and the key is not valid."""
    headers, state = request.headers, request.app.state
    key = presented_key(headers.get("authorization"), headers.get("x-api-key"))
    return await principal_of(state.settings, state.pool, key)


async def get_service(request: Request) -> RunService:
    """Return what the API asks of runs, bound to this process's parts."""
    # One dependency rather than six: each costs its own resolution on every request.
    state = request.app.state
    runtime = state.runtime
    return RunService(
        state.pool,
        state.settings,
        state.models,
        state.tools,
        runtime.metrics,
        runtime.tracing,
        state.post_memo,
        runtime.worker,
    )


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def get_memory_service(request: Request, who: PrincipalDep) -> MemoryService:
    """Return the memory store's service for the caller.

    Raises:
        MemoryUnavailableError: this process runs without a memory store.
    """
    store = request.app.state.runtime.store
    if store is None:
        raise MemoryUnavailableError("this server has no memory store")
    return MemoryService(store, who)


ServiceDep = Annotated[RunService, Depends(get_service)]
MemoryDep = Annotated[MemoryService, Depends(get_memory_service)]


async def get_artifact_service(request: Request) -> ArtifactService:
    """Return the artifacts' service, over this process's storage."""
    state = request.app.state
    storage = state.runtime.artifacts
    return ArtifactService(state.pool, storage, url_ttl_s=state.settings.artifact_url_ttl_s)


ArtifactsDep = Annotated[ArtifactService, Depends(get_artifact_service)]


async def get_skill_service(request: Request, who: PrincipalDep) -> SkillService:
    """Return the skills of the caller's tenant."""
    return SkillService(request.app.state.pool, who)


SkillsDep = Annotated[SkillService, Depends(get_skill_service)]


async def get_subagent_service(request: Request) -> SubagentService:
    """Return what the API asks of subagents."""
    return SubagentService(request.app.state.pool)


SubagentDep = Annotated[SubagentService, Depends(get_subagent_service)]


async def get_langgraph(request: Request) -> LangGraphService:
    """Return the LangGraph API's service for the caller (docs/langgraph.md).

    The caller is named by langgraph.json's auth handler when it has one, else by API key.
    """
    state = request.app.state
    runtime = state.runtime
    guard, user = None, None
    if runtime.graphs.auth is not None:
        guard = GraphAuth(runtime.graphs.auth, state.settings.default_tenant)
        who, user = await guard.authenticate(request)
    else:
        who = await get_principal(request)
    return LangGraphService(
        state.pool,
        runtime.graphs,
        state.notifier,
        state.settings,
        who,
        runtime.stopping,
        runtime.store,
        guard,
        user,
    )


LangGraphDep = Annotated[LangGraphService, Depends(get_langgraph)]


async def get_knowledge_service(request: Request, who: PrincipalDep) -> KnowledgeService:
    """Return the knowledge bases' service for the caller."""
    state = request.app.state
    return KnowledgeService(state.pool, state.settings, who, search=state.runtime.knowledge)


KnowledgeDep = Annotated[KnowledgeService, Depends(get_knowledge_service)]
