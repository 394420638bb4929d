"""One attempt at a claimed run: drive the compiled graph and say how the attempt ended.

`Attempt` starts the graph for a new run or resumes it from its checkpoint, streams it
through the projector under the run's deadline and `RunControl`, and turns whatever stops it
into an `Outcome`; server/runs/executor.py stores that outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphDrained
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl
from langgraph.types import Command, Interrupt, StateSnapshot

from graphs.context import RunContext
from graphs.events import EventType
from server.agents.context_store import PostgresSummaryStore
from server.agents.runtime import context_setup, profile_toolbox, run_caller
from server.agents.store import AgentVersion, recorded_agent
from server.artifacts.storage import Storage
from server.artifacts.writer import RunArtifacts
from server.db.checkpoint import (
    FENCE_GENERATION,
    FENCE_LAST,
    FENCE_RIDER,
    FENCE_RUN,
    LastCheckpoint,
    Rider,
    reusing_reads,
)
from server.db.pool import Pool
from server.errors import LeaseLostError, RunFinishedError, RunTimeoutError
from server.events.projection import STREAM_MODES, EventSink, StreamProjector
from server.langgraph_api.graphs import GraphRegistry
from server.observability.metrics import Metrics
from server.observability.tracing import Tracing
from server.runs.failures import describe_failure
from server.runs.records import Claim
from server.runs.toolbox import overlay_of
from server.settings import Settings
from server.skills.library import PostgresSkillLibrary
from server.subagents.suspend import resume_value
from server.subagents.usage import lowered_by_children
from server.usage.budgets import run_budget
from server.usage.registry import ModelRegistry
from tools.config import TenantToolConfig
from tools.knowledge.search import KnowledgeSearch
from tools.ledger import HeldOutcomes
from tools.registry import ToolRegistry

GraphInput = dict[str, Any] | Command[Any] | None
# The key of the `updates` part LangGraph streams when the graph stops on interrupts.
INTERRUPT = "__interrupt__"


@dataclass(frozen=True)
class ExecutorDeps:
    """What every run needs from the process: the graph, models, tools and settings."""

    pool: Pool
    graph: CompiledStateGraph[Any, Any, Any, Any]
    models: ModelRegistry
    tools: ToolRegistry
    settings: Settings
    tracing: Tracing
    metrics: Metrics
    # Where tools' artifacts are stored (docs/artifacts.md); None: runs have no artifacts.
    artifacts: Storage | None = None
    # The graphs of langgraph.json, for runs started through the LangGraph API.
    graphs: GraphRegistry | None = None
    knowledge: KnowledgeSearch | None = None


@dataclass
class RunHandle:
    """A worker's grip on one executing run: drain it, or say why it is being cancelled."""

    control: RunControl = field(default_factory=RunControl)
    # Set before task.cancel(): "cancel" (a user asked), "lease_lost", or "shutdown".
    stop_reason: str | None = None
    # An operator asked to pause: the drain ends in `run.paused` rather than a requeue.
    pause_requested: bool = False

    def request_pause(self) -> None:
        """Stop the run at its next step boundary and store it as paused."""
        self.pause_requested = True
        self.control.request_drain("pause")


@dataclass
class Outcome:
    """How an attempt ended, and what to store for it."""

    kind: str  # completed | failed | cancelled | requeued | paused | suspended | abandoned
    data: dict[str, Any] = field(default_factory=dict)
    cancelled: bool = False  # the task was cancelled; re-raise after storing


def close_unanswered_calls(messages: list[BaseMessage]) -> list[ToolMessage]:
    """Answer tool calls an earlier run left open (it was cancelled while they waited).

    Providers refuse a conversation whose tool calls have no results, so each gets an error
    result before the next user message.
    """
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if last is None:
        return []
    return [
        ToolMessage(
            content="Error (cancelled): the run that made this call ended before it ran",
            tool_call_id=call["id"] or "",
            name=call["name"],
            status="error",
        )
        for call in last.tool_calls
        if call["id"] not in answered
    ]


def _seconds_left(deadline: datetime | None) -> float | None:
    if deadline is None:
        return None
    return (deadline - datetime.now(UTC)).total_seconds()


def _task_messages(tasks: Sequence[Any]) -> list[BaseMessage]:
    """Return the messages that finished tasks of a state snapshot wrote."""
    found: list[BaseMessage] = []
    for task in tasks:
        written = task.result.get("messages") if isinstance(task.result, dict) else None
        if isinstance(written, BaseMessage):
            found.append(written)
        elif isinstance(written, list):
            found += [m for m in written if isinstance(m, BaseMessage)]
    return found


class Attempt:
    """One attempt at a claimed run, from its graph input to its `Outcome`.

    Args:
        deps: The process's graph, models, tools and settings.
        claim: The run as claimed, its head and its input message.
        handle: How the worker drains or stops this attempt.
        projector: Turns the graph's stream into the run's events.
        emit: Stores one event (through the run's writer).
        recorded: Ids of the message items earlier attempts completed.
        rider: The run's event writer, whose reports ride the attempt's checkpoint writes.
        held: On a run's first attempt: where the tool ledger keeps the calls it writes with
            their outcome's event (the writer's `held_outcomes` hook writes them).
    """

    def __init__(
        self,
        deps: ExecutorDeps,
        claim: Claim,
        handle: RunHandle,
        projector: StreamProjector,
        emit: EventSink,
        recorded: set[str],
        rider: Rider | None = None,
        held: HeldOutcomes | None = None,
    ) -> None:
        self.deps = deps
        self.claim = claim
        self.run = claim.run
        self.handle = handle
        self.projector = projector
        self.emit = emit
        self.recorded = recorded
        self.rider = rider
        self.held = held
        # The graph's last checkpoint, held for the run's end (docs/decisions/2021).
        self.last = LastCheckpoint()

    async def execute(self, callbacks: list[BaseCallbackHandler]) -> Outcome:
        """Drive the graph under the run's deadline; return how the attempt ended."""
        deadline = asyncio.timeout(_seconds_left(self.run.deadline_at))
        try:
            async with deadline:
                interrupts = await self._drive(callbacks)
        except asyncio.CancelledError:
            return self._stopped()
        except GraphDrained:
            if self.handle.pause_requested:
                return Outcome("paused", {"reason": "pause requested", "from": "running"})
            return Outcome("requeued", {"reason": "worker draining"})
        except (LeaseLostError, RunFinishedError) as exc:
            return Outcome("abandoned", {"reason": f"lease lost: {exc}"})
        except (psycopg.OperationalError, psycopg.errors.ConnectionTimeout) as exc:
            # The database went away mid-step: write nothing more; the lease expires and the run
            # is recovered from its last checkpoint when the database is back.
            return Outcome("abandoned", {"reason": f"database unavailable: {exc}"})
        except Exception as exc:
            if isinstance(exc, TimeoutError) and deadline.expired():
                exc = self._timed_out()
            self.projector.close_open_items("interrupted", "run failed")
            return Outcome("failed", describe_failure(exc))
        if interrupts:
            return Outcome("suspended", {"interrupts": interrupts})
        return Outcome("completed")

    def _stopped(self) -> Outcome:
        """The outcome of an attempt whose task was cancelled, by why the worker stopped it."""
        if self.handle.stop_reason == "cancel":
            self.projector.close_open_items("interrupted", "run cancelled")
            return Outcome("cancelled", {"reason": "cancel requested"}, cancelled=True)
        if self.handle.stop_reason == "shutdown":
            # Hand the run back at once instead of waiting for the lease to expire.
            return Outcome("requeued", {"reason": "worker stopped"}, cancelled=True)
        return Outcome("abandoned", {"reason": "lease lost"}, cancelled=True)

    def _timed_out(self) -> RunTimeoutError:
        deadline = self.run.deadline_at.isoformat() if self.run.deadline_at else "unset"
        return RunTimeoutError(
            f"the run passed its wall-clock deadline ({deadline}); "
            "raise the run option timeoutSeconds or AGENTRT_RUN_TIMEOUT_S"
        )

    async def _drive(self, callbacks: list[BaseCallbackHandler]) -> Sequence[Interrupt]:
        """Start or resume the graph; return the interrupts it stopped on (none: it finished)."""
        # The graph's loop starts from the state read here. A thread the claim found without
        # a checkpoint is read by neither (docs/decisions/2056).
        stored = self.claim.reads.thread_stored
        with reusing_reads(self.run.conversation_id, stored=stored):
            agent, overlay = self._starts_from()
            state = await self.deps.graph.aget_state(self._thread())
            config = self._config(callbacks, agent)
            context = await self._context(agent, overlay)
            graph_input: GraphInput
            if state.values.get("run_id") == self.run.id:
                graph_input = await self._resume_input(state)
                if graph_input is None and state.interrupts:
                    return state.interrupts  # decisions still missing: ask (again) and wait
                # `next` leaves out tasks whose writes were saved before a crash; they lead on.
                if graph_input is None and not state.next and not state.tasks:
                    return ()  # the graph finished before the previous attempt recorded it
            else:
                self.projector.supersede_unsaved([], self.run.input_message_id, self.recorded)
                graph_input = self._first_input(state)
            # "sync": each step's checkpoint is stored before the next step starts, so no tool
            # runs for a model turn that is not checkpointed, and a failed write stops there.
            interrupted = False
            async for mode, chunk in self.deps.graph.astream(
                graph_input,
                config,
                context=context,
                stream_mode=STREAM_MODES,
                control=self.handle.control,
                durability="sync",
            ):
                self.projector.handle(mode, chunk)
                interrupted = interrupted or (mode == "updates" and INTERRUPT in chunk)
        if not interrupted:
            # Every stop on an interrupt streams an `__interrupt__` update: a stream without
            # one ran to its end, and reading the whole state back would find none.
            return ()
        return (await self.deps.graph.aget_state(config)).interrupts

    def _starts_from(self) -> tuple[AgentVersion, TenantToolConfig | None]:
        """The run's profile version and its tenant's tool configuration, as its claim read them.

        Raises:
            AgentNotFoundError: the version the run recorded is gone.
        """
        reads = self.claim.reads
        return recorded_agent(reads.profile, *self.run.agent), overlay_of(reads.tool_config)

    def _thread(self) -> RunnableConfig:
        return {"configurable": {"thread_id": self.run.conversation_id}}

    def _config(self, callbacks: list[BaseCallbackHandler], agent: AgentVersion) -> RunnableConfig:
        return {
            "configurable": {
                **self._thread()["configurable"],
                **self._fence(),
                FENCE_LAST: self.last,
            },
            "recursion_limit": self._max_steps(agent) * 4 + 10,
            "callbacks": callbacks,
        }

    def _fence(self) -> dict[str, Any]:
        """The `configurable` keys that fence the run's checkpoint writes by its lease."""
        fence: dict[str, Any] = {
            FENCE_RUN: self.run.id,
            FENCE_GENERATION: self.run.lease_generation,
        }
        if self.rider is not None:  # the run's queued events ride in those writes
            fence[FENCE_RIDER] = self.rider
        return fence

    def _max_steps(self, agent: AgentVersion) -> int:
        options, settings = self.run.options, self.deps.settings
        return int(options.get("maxSteps") or agent.spec.max_steps or settings.max_steps)

    async def _context(self, agent: AgentVersion, overlay: TenantToolConfig | None) -> RunContext:
        """Build the run's LangGraph context: its profile's model caller, toolbox and limits."""
        deps, run = self.deps, self.run
        toolbox = await profile_toolbox(deps.tools, deps.pool, run, agent, overlay, self.held)
        for source, reason in sorted(toolbox.unavailable.items()):
            if source.startswith("mcp:"):
                self.emit(EventType.TOOLS_UNAVAILABLE, {"source": source, "reason": reason})
        budget = await lowered_by_children(
            deps.pool, run, self.claim.head.snapshot, run_budget(run.options, deps.settings)
        )
        caller = run_caller(deps.models, run.model, agent, budget=budget, totals=run.usage or None)
        return RunContext(
            run_id=run.id,
            conversation_id=run.conversation_id,
            tenant_id=run.tenant_id,
            user_id=run.user_id,
            model_caller=caller,
            tools=toolbox.visible(),
            toolbox=toolbox,
            max_steps=self._max_steps(agent),
            tool_timeout_s=deps.settings.tool_timeout_s,
            system_prompt=agent.spec.instructions,
            attempt=run.attempt,
            context_setup=context_setup(
                agent,
                run.model,
                models=deps.models,
                settings=deps.settings,
                summaries=PostgresSummaryStore(deps.pool, run.tenant_id),
                caller=caller,
                roles=run.principal_roles,
                skills=PostgresSkillLibrary(deps.pool, run.tenant_id, agent.spec.skills.allowed),
                knowledge=deps.knowledge,
            ),
            artifacts=self._artifacts(),
            ending=self.last.expect,
            deferring=self.last.defer,
        )

    def _artifacts(self) -> RunArtifacts | None:
        deps = self.deps
        if deps.artifacts is None:
            return None
        return RunArtifacts(
            deps.pool,
            deps.artifacts,
            self.run,
            max_bytes=deps.settings.artifact_max_bytes,
            file_root=deps.settings.artifact_file_root,
        )

    async def _resume_input(self, state: StateSnapshot) -> Command[Any] | None:
        """Reconcile the log with the checkpoint; return the approvals' resume, if any.

        None resumes the run from its last checkpoint.
        """
        checkpointed = state.values.get("messages", [])
        # Tasks of the next step that finished before the crash: LangGraph restores their saved
        # writes instead of running them again, so their answers count as saved too.
        saved = [*checkpointed, *_task_messages(state.tasks)]
        input_id = self.run.input_message_id
        self.projector.supersede_unsaved(saved, input_id, self.recorded)
        self.projector.replay_missing(checkpointed, input_id, self.recorded)
        if not state.interrupts:
            return None
        return await resume_value(self.deps.pool, self.run.id, state.interrupts)

    def _first_input(self, state: StateSnapshot) -> dict[str, Any]:
        """The input of a run's first step: its user message after the thread's history."""
        return {
            "messages": [
                *close_unanswered_calls(state.values.get("messages", [])),
                HumanMessage(self.claim.input, id=self.run.input_message_id),
            ],
            "run_id": self.run.id,
            "step": 0,
        }
