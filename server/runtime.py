"""The process runtime: pool, migrations, checkpointer, graph, notifier and (optionally) worker.

Shared by the API server (`create_app`'s lifespan) and the worker process (`agentrt worker`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from langgraph.graph.state import CompiledStateGraph
from opentelemetry.sdk.trace.export import SpanExporter

from graphs.agent import build_agent_graph
from server.checkpoint import FencedPostgresSaver
from server.db import Pool, migrate, migration_lock, open_pool, resolve_database_url
from server.executor import ExecutorDeps
from server.maintenance import prune_checkpoints
from server.metrics import Metrics
from server.models import ModelRegistry
from server.notify import Notifier
from server.settings import Settings
from server.tracing import Tracing
from server.worker import Worker
from tools.registry import ToolRegistry

log = logging.getLogger("agentrt")


@dataclass
class Runtime:
    """What a running process holds."""

    url: str
    pool: Pool
    graph: CompiledStateGraph[Any, Any, Any, Any]
    checkpointer: FencedPostgresSaver
    notifier: Notifier
    worker: Worker | None
    tracing: Tracing
    metrics: Metrics


def redact_url(url: str) -> str:
    """Hide the password in a database URL for logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


async def setup_checkpointer(pool: Pool) -> FencedPostgresSaver:
    """Create LangGraph's (fenced) checkpointer on our pool and run its migrations once."""
    checkpointer = FencedPostgresSaver(pool)
    async with migration_lock(pool):
        await checkpointer.setup()
    return checkpointer


@asynccontextmanager
async def open_runtime(
    settings: Settings,
    models: ModelRegistry,
    tools: ToolRegistry,
    *,
    run_workers: bool,
    span_exporters: Sequence[SpanExporter] = (),
) -> AsyncIterator[Runtime]:
    """Start everything a process needs; on exit drain the worker and close the rest."""
    url = await asyncio.to_thread(resolve_database_url, settings)
    await asyncio.to_thread(models.warm_up)
    async with open_pool(url, settings) as pool:
        applied = await migrate(pool)
        checkpointer = await setup_checkpointer(pool)
        graph = build_agent_graph().compile(checkpointer=checkpointer)
        notifier = Notifier(url)
        await notifier.start()
        metrics = Metrics()
        tracing = Tracing(pool, settings, metrics, span_exporters)
        tracing.start()
        worker = None
        if run_workers:
            deps = ExecutorDeps(pool, graph, models, tools, settings, tracing, metrics)
            worker = Worker(deps, notifier)
            await worker.start()
        log.info(
            "agentrt ready: database %s%s, model %s, workers %s",
            redact_url(url),
            " (embedded)" if not settings.database_url else "",
            settings.default_model,
            f"in-process x{settings.worker_concurrency}" if worker else "none",
        )
        if applied:
            log.info("applied migrations: %s", ", ".join(applied))
        housekeeping = (
            asyncio.create_task(_housekeeping(pool, checkpointer, settings)) if worker else None
        )
        try:
            yield Runtime(url, pool, graph, checkpointer, notifier, worker, tracing, metrics)
        finally:
            if housekeeping is not None:
                housekeeping.cancel()
                await asyncio.gather(housekeeping, return_exceptions=True)
            if worker is not None:
                await worker.stop()
            await tracing.stop()
            await notifier.stop()


async def _housekeeping(pool: Pool, checkpointer: FencedPostgresSaver, settings: Settings) -> None:
    while True:
        await asyncio.sleep(settings.prune_interval_s)
        try:
            await prune_checkpoints(
                pool, checkpointer, retention_days=settings.checkpoint_retention_days
            )
        except Exception:
            log.exception("checkpoint pruning failed; will retry")
