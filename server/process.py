"""The process runtime: pool, migrations, checkpointer, graph, notifier and (optionally) worker.

Shared by the API server (`create_app`'s lifespan) and the worker process (`agentrt worker`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from langgraph.graph.state import CompiledStateGraph
from langgraph.store.postgres import AsyncPostgresStore
from opentelemetry.sdk.trace.export import SpanExporter

from graphs.agent import build_agent_graph
from server.agents.files import sync_agents
from server.artifacts.retention import prune_artifacts
from server.artifacts.storage import Storage, make_storage
from server.db.checkpoint import HOLD_WRITES_S, FencedPostgresSaver
from server.db.maintenance import prune_checkpoints
from server.db.pool import Pool, database_url, migrate, migration_lock, open_pool
from server.errors import MemoryConfigError, StartupError
from server.events.channels import CHANNELS, WORKER_CHANNELS
from server.events.notify import Notifier
from server.knowledge.jobs import KnowledgeJobs
from server.knowledge.search import PostgresKnowledgeSearch
from server.knowledge.setup import open_knowledge
from server.langgraph_api.graphs import GraphRegistry, load_graphs
from server.langgraph_api.jobs import LangGraphJobs
from server.lifecycle.retention import apply_retention
from server.memory.jobs import MemoryJobs
from server.memory.store import index_kind, make_embedder, open_memory_store, prune_expired_memories
from server.observability.metrics import Metrics
from server.observability.tracing import Tracing
from server.runs.attempt import ExecutorDeps
from server.runs.worker import Worker
from server.settings import Settings
from server.skills.store import sync_repository
from server.startup import check_database, redact_url, waiting
from server.usage.registry import ModelRegistry
from tools.registry import ToolRegistry

log = logging.getLogger("agentrt")

GC_YOUNG_THRESHOLD = 10_000
"""Allocations, less deallocations, of tracked objects between the collector's young passes
(Python's default is 700). Most of what a run's step or a request makes is freed by its
reference count soon after; at 700 a pass falls in the middle of a step and examines, then
promotes, what is still in flight, and the full passes it leads to cost tens of milliseconds
with 32 runs in flight (docs/decisions/2031)."""


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
    store: AsyncPostgresStore | None = None
    memory_jobs: MemoryJobs | None = None
    artifacts: Storage | None = None
    graphs: GraphRegistry = field(default_factory=GraphRegistry)
    knowledge: PostgresKnowledgeSearch | None = None
    knowledge_jobs: KnowledgeJobs | None = None
    drain_grace_s: float = 20.0
    # Set on the first stop request: open event streams end so that clients reconnect
    # (with Last-Event-ID) to another server instead of holding this one up.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def request_stop(self) -> None:
        """Announce the drain on the first call; hand every run back at once on the second.

        Must be called on the event loop's thread (`loop.call_soon_threadsafe` from a signal
        handler).
        """
        if self.stopping.is_set():
            if self.worker is not None:
                log.warning(
                    "stopping now: handing %d runs back to the queue",
                    len(self.worker.active_runs),
                )
                self.worker.hurry.set()
            return
        self.stopping.set()
        self.notifier.wake_all()
        runs = len(self.worker.active_runs) if self.worker is not None else 0
        log.warning(
            "draining %d runs, up to %g s; press Ctrl-C again to stop now",
            runs,
            self.drain_grace_s if runs else 0,
        )


async def setup_checkpointer(pool: Pool, hold_s: float = HOLD_WRITES_S) -> FencedPostgresSaver:
    """Create LangGraph's (fenced) checkpointer on our pool and run its migrations once.

    `hold_s`: how long a run's task writes, and a checkpoint that may wait, wait for the next
    checkpoint write to go in its transaction (0: not at all).
    """
    checkpointer = FencedPostgresSaver(pool, hold_writes_s=hold_s)
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
    serves_streams: bool = True,
) -> AsyncIterator[Runtime]:
    """Start everything a process needs; on exit drain the worker and close the rest.

    A process with `serves_streams=False` (`agentrt worker`) does not listen to the event
    log's notifications (see `Notifier`).
    """
    async with AsyncExitStack() as stack:
        async with waiting(
            "the embedded database to start" if not settings.database_url else "the database"
        ):
            url = await stack.enter_async_context(database_url(settings))
            await check_database(url)
        if models.needs_litellm:
            async with waiting("litellm to load (model provider checks)"):
                await asyncio.to_thread(models.warm_up)
        async with waiting("the database connection pool"):
            pool = await stack.enter_async_context(open_pool(url, settings))
        async with waiting("schema migrations (another process may hold the migration lock)"):
            applied = await migrate(pool)
            checkpointer = await setup_checkpointer(pool, settings.checkpoint_hold_s)
        await sync_agents(pool, settings)
        await sync_repository(pool, settings.skills_dir)
        metrics = Metrics()
        tracing = Tracing(pool, settings, metrics, span_exporters)
        try:
            embedder = make_embedder(settings, pool=pool, tracing=tracing, price=models.pricer)
            async with waiting("the memory store (another process may hold the migration lock)"):
                store = await open_memory_store(pool, embedder, index_kind(settings, url))
        except MemoryConfigError as exc:
            raise StartupError(str(exc)) from exc
        knowledge = await open_knowledge(
            pool, settings, tracing=tracing, price=models.pricer, url=url
        )
        # Nodes and tools reach the store through LangGraph's runtime (`get_store()`).
        graph = build_agent_graph().compile(checkpointer=checkpointer, store=store)
        artifacts = make_storage(settings)
        graphs = load_graphs(
            settings.langgraph_config, checkpointer=checkpointer, store=store, own_graph=graph
        )
        notifier = Notifier(url, CHANNELS if serves_streams else WORKER_CHANNELS)
        async with waiting("the notification listener"):
            await notifier.start()
        tracing.start()
        worker = None
        memory_jobs = None
        graph_jobs = None
        knowledge_jobs = None
        if run_workers:
            deps = ExecutorDeps(
                pool,
                graph,
                models,
                tools,
                settings,
                tracing,
                metrics,
                artifacts=artifacts,
                graphs=graphs,
                knowledge=knowledge,
            )
            worker = Worker(deps, notifier)
            await worker.start()
            memory_jobs = MemoryJobs(pool, store, models, settings)
            await memory_jobs.start()
            graph_jobs = LangGraphJobs(pool, graphs, notifier, settings, store)
            await graph_jobs.start()
            knowledge_jobs = KnowledgeJobs(
                pool, knowledge.embedders, settings, cells=knowledge.probes is not None
            )
            await knowledge_jobs.start()
        # What start-up made (modules, the compiled graphs, pools) lives as long as the process:
        # out of the collector's way, so that its full passes walk only what runs make.
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
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
            asyncio.create_task(_housekeeping(pool, checkpointer, settings, metrics, artifacts))
            if worker
            else None
        )
        try:
            yield Runtime(
                url,
                pool,
                graph,
                checkpointer,
                notifier,
                worker,
                tracing,
                metrics,
                store=store,
                memory_jobs=memory_jobs,
                artifacts=artifacts,
                graphs=graphs,
                knowledge=knowledge,
                knowledge_jobs=knowledge_jobs,
                drain_grace_s=settings.drain_grace_s,
            )
        finally:
            if housekeeping is not None:
                housekeeping.cancel()
                await asyncio.gather(housekeeping, return_exceptions=True)
            if memory_jobs is not None:
                await memory_jobs.stop()
            if graph_jobs is not None:
                await graph_jobs.stop()
            if knowledge_jobs is not None:
                await knowledge_jobs.stop()
            if worker is not None:
                await worker.stop()
            await tracing.stop()
            await notifier.stop()


async def _housekeeping(
    pool: Pool,
    checkpointer: FencedPostgresSaver,
    settings: Settings,
    metrics: Metrics,
    artifacts: Storage,
) -> None:
    while True:
        try:
            # First: partitions for the coming days exist before events need them.
            await apply_retention(pool, settings, metrics=metrics)
        except Exception:
            log.exception("applying the retention failed; will retry")
        await asyncio.sleep(settings.prune_interval_s)
        try:
            await prune_checkpoints(
                pool, checkpointer, retention_days=settings.checkpoint_retention_days
            )
            await prune_expired_memories(pool)
        except Exception:
            log.exception("checkpoint and memory pruning failed; will retry")
        try:
            await prune_artifacts(pool, artifacts, settings)
        except Exception:
            log.exception("artifact pruning failed; will retry")
