"""Execute one claimed run: drive the compiled graph and turn its stream into events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphDrained, GraphRecursionError
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl
from langgraph.types import Command, Interrupt
from opentelemetry.trace import Status, StatusCode

from graphs.context import RunContext
from nodes.errors import (
    BudgetExceededError,
    ContextOverflowError,
    ModelCallFailedError,
    StepLimitError,
)
from nodes.models.usage import Budget
from server.agents.runtime import context_setup, profile_toolbox, run_caller
from server.agents.store import run_agent
from server.db.checkpoint import FENCE_GENERATION, FENCE_RUN
from server.db.pool import Pool
from server.events.log import Conn, LeaseLostError, RunFinishedError, RunHead
from server.events.projection import STREAM_MODES, StreamProjector
from server.events.snapshot import output_text, streaming_items
from server.events.writer import EventWriter
from server.ids import new_id
from server.memory.jobs import enqueue_extraction
from server.observability.callbacks import TraceCallbackHandler
from server.observability.logs import run_context
from server.observability.metrics import Metrics
from server.observability.tracing import RunInfo, Tracing
from server.runs.approvals import resume_command, suspend
from server.runs.pausing import mark_paused
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tools.registry import ToolRegistry

log = logging.getLogger(__name__)


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


class RunTimeoutError(TimeoutError):
    """The run passed its wall-clock deadline."""


def classify_failure(exc: BaseException) -> tuple[str, str, dict[str, Any]]:
    """Name why a run failed: (error type, message a person can act on, details).

    A failed model call details its error class, provider, model, attempts and last status
    code; an exhausted budget names the limit, what it allowed and what was used.
    """
    if isinstance(exc, StepLimitError | ContextOverflowError):
        return exc.reason, str(exc), {}
    if isinstance(exc, ModelCallFailedError | BudgetExceededError):
        return exc.reason, str(exc), dict(exc.details)
    if isinstance(exc, GraphRecursionError):
        return "step_limit", "the graph exceeded its recursion limit without finishing", {}
    if isinstance(exc, RunTimeoutError):
        return "timeout", str(exc), {}
    return type(exc).__name__, str(exc) or repr(exc), {}


def _tightest(*values: Any) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def run_budget(options: dict[str, Any], settings: Settings) -> Budget:
    """Return the run's budget: its options may lower the settings' limits, never raise them."""
    cost = options.get("maxCost")
    return Budget(
        max_tokens=_tightest(options.get("maxTokens"), settings.budget_max_tokens),
        max_cost=_tightest(None if cost is None else Decimal(str(cost)), settings.budget_max_cost),
        max_model_calls=_tightest(options.get("maxModelCalls"), settings.budget_max_model_calls),
    )


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


async def _load_input(conn: Conn, message_id: str) -> str:
    cur = await conn.execute("SELECT content FROM messages WHERE id = %s", (message_id,))
    row = await cur.fetchone()
    assert row is not None, f"input message {message_id} is missing"
    return str(row["content"])


def _seconds_left(deadline: datetime | None) -> float | None:
    if deadline is None:
        return None
    return (deadline - datetime.now(UTC)).total_seconds()


@dataclass
class Outcome:
    """How an attempt ended, and what to store for it."""

    kind: str  # completed | failed | cancelled | requeued | paused | suspended | abandoned
    data: dict[str, Any] = field(default_factory=dict)
    cancelled: bool = False  # the task was cancelled; re-raise after storing


async def execute_run(
    deps: ExecutorDeps, run: dict[str, Any], head: RunHead, handle: RunHandle | None = None
) -> None:
    """Run the graph for a claimed run until it ends, drains, is cancelled, or loses its lease.

    `head` is the run's head right after the claim stored `run.started`. Whatever happens,
    the run leaves this function terminal, back in the queue, waiting, or (when the lease or
    the database is lost) untouched for the reaper to recover. The attempt is one span of the
    run's trace; spans are stored before the run's final event.
    """
    handle = handle or RunHandle()
    writer = EventWriter(deps.pool, head, on_stored=deps.metrics.events_written.inc)

    def emit(kind: str, data: dict[str, Any] | None = None) -> None:
        deps.metrics.observe_event(kind, data or {})
        writer.emit(kind, data)

    projector = StreamProjector(emit, {i["itemId"]: i["status"] for i in head.snapshot["items"]})
    for item in streaming_items(head.snapshot):
        # An earlier attempt died mid-answer; its partial text is replaced by this attempt's.
        writer.emit(
            "message.item.completed",
            {
                "itemId": item["itemId"],
                "status": "superseded",
                "text": item["text"],
                "reason": "attempt abandoned",
            },
        )
    recorded = {i["itemId"] for i in head.snapshot["items"] if i["status"] == "completed"}
    info = RunInfo(run["id"], run["conversation_id"], run["tenant_id"], head.attempt)
    token = run_context.set({"run_id": run["id"], "tenant_id": run["tenant_id"]})
    try:
        with deps.tracing.attempt(info) as span:
            handler = TraceCallbackHandler(deps.tracing, info, span)
            outcome = await _attempt(deps, run, projector, handle, [handler], emit, recorded)
            handler.close_all(f"attempt ended: {outcome.kind}")
            if outcome.kind == "failed":
                span.set_status(Status(StatusCode.ERROR, outcome.data["message"]))
            span.set_attribute("agentrt.outcome", outcome.kind)
        if await _conclude_shielded(deps, writer, run, outcome, pause=handle.pause_requested):
            outcome.cancelled = True
    finally:
        run_context.reset(token)
    if outcome.cancelled:
        raise asyncio.CancelledError


async def _attempt(
    deps: ExecutorDeps,
    run: dict[str, Any],
    projector: StreamProjector,
    handle: RunHandle,
    callbacks: list[Any],
    emit: Any,
    recorded: set[str],
) -> Outcome:
    deadline = asyncio.timeout(_seconds_left(run.get("deadline_at")))
    try:
        async with deadline:
            interrupts = await _drive(deps, run, projector, handle, callbacks, emit, recorded)
    except asyncio.CancelledError:
        if handle.stop_reason == "cancel":
            projector.close_open_items("interrupted", "run cancelled")
            return Outcome("cancelled", {"reason": "cancel requested"}, cancelled=True)
        if handle.stop_reason == "shutdown":
            # Hand the run back at once instead of waiting for the lease to expire.
            return Outcome("requeued", {"reason": "worker stopped"}, cancelled=True)
        return Outcome("abandoned", {"reason": "lease lost"}, cancelled=True)
    except GraphDrained:
        if handle.pause_requested:
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
            exc = RunTimeoutError(
                f"the run passed its wall-clock deadline ({run['deadline_at'].isoformat()}); "
                "raise the run option timeoutSeconds or AGENTRT_RUN_TIMEOUT_S"
            )
        projector.close_open_items("interrupted", "run failed")
        error_type, message, details = classify_failure(exc)
        return Outcome("failed", {"errorType": error_type, "message": message, **details})
    if interrupts:
        return Outcome("suspended", {"interrupts": interrupts})
    return Outcome("completed")


async def _conclude_shielded(
    deps: ExecutorDeps,
    writer: EventWriter,
    run: dict[str, Any],
    outcome: Outcome,
    *,
    pause: bool = False,
) -> bool:
    """Store the attempt's outcome even if the task is cancelled meanwhile.

    A cancel that arrives while the outcome is being stored waits for it, so the run ends
    with that outcome (a completion that won stays completed) instead of being left for its
    lease to expire. Return whether a cancel arrived, so the caller can re-raise it.
    """
    conclusion = asyncio.ensure_future(_conclude(deps, writer, run, outcome, pause=pause))
    cancelled = False
    while not conclusion.done():
        try:
            await asyncio.shield(conclusion)
        except asyncio.CancelledError:
            cancelled = True
    conclusion.result()
    return cancelled


async def _conclude(
    deps: ExecutorDeps,
    writer: EventWriter,
    run: dict[str, Any],
    outcome: Outcome,
    *,
    pause: bool = False,
) -> None:
    run_id = run["id"]
    if outcome.kind in ("completed", "failed", "cancelled"):
        deps.tracing.end_run(run, outcome.kind, outcome.data.get("message"))
        elapsed = (datetime.now(UTC) - run["created_at"]).total_seconds()
        deps.metrics.observe_run_end(run["tenant_id"], outcome.kind, elapsed)
    try:
        await deps.tracing.sink.flush()
    except Exception:
        log.exception("run %s: storing its spans failed; they will be retried", run_id)
    if outcome.kind == "completed":
        await _complete(writer, run)
    elif outcome.kind == "suspended":
        # Stopped for a human: store the approvals, release the run, hold nothing.
        try:
            await suspend(deps.pool, writer, run, outcome.data["interrupts"])
        except (LeaseLostError, RunFinishedError) as exc:
            log.info("run %s: approvals not stored: %s", run_id, exc)
            pause = False
        if pause:  # asked while the step ran: pause now, approvals kept pending
            data = {"reason": "pause requested", "from": "waiting_user"}
            await _finish(writer, "run.paused", data, mark_paused)
        else:
            await writer.close()
    elif outcome.kind == "paused":
        await _finish(writer, "run.paused", outcome.data, mark_paused)
    elif outcome.kind == "abandoned":
        log.info("run %s: %s; stopped without writing", run_id, outcome.data["reason"])
        await writer.close()
    else:
        if outcome.kind == "failed":
            log.info(
                "run %s failed: %s: %s", run_id, outcome.data["errorType"], outcome.data["message"]
            )
        await _finish(writer, f"run.{outcome.kind}", outcome.data)


async def _drive(
    deps: ExecutorDeps,
    run: dict[str, Any],
    projector: StreamProjector,
    handle: RunHandle,
    callbacks: list[Any],
    emit: Any,
    recorded: set[str],
) -> Sequence[Interrupt]:
    """Start or resume the graph; return the interrupts it stopped on (none: it finished)."""
    run_id = run["id"]
    options = run["options"] or {}
    async with deps.pool.connection() as conn:
        agent = await run_agent(conn, run["tenant_id"], run["agent_name"], run["agent_version"])
    max_steps = int(options.get("maxSteps") or agent.spec.max_steps or deps.settings.max_steps)
    config: RunnableConfig = {
        "configurable": {
            "thread_id": run["conversation_id"],
            FENCE_RUN: run_id,
            FENCE_GENERATION: run["lease_generation"],
        },
        "recursion_limit": max_steps * 4 + 10,
        "callbacks": callbacks,
    }
    toolbox = await profile_toolbox(deps.tools, deps.pool, run, agent)
    for source, reason in sorted(toolbox.unavailable.items()):
        if source.startswith("mcp:"):
            emit("tools.unavailable", {"source": source, "reason": reason})
    budget = run_budget(options, deps.settings)
    caller = run_caller(deps.models, run, agent, budget=budget, totals=run.get("usage") or None)
    context = RunContext(
        run_id=run_id,
        conversation_id=run["conversation_id"],
        tenant_id=run["tenant_id"],
        user_id=run["user_id"],
        model_caller=caller,
        tools=toolbox.visible(),
        toolbox=toolbox,
        max_steps=max_steps,
        tool_timeout_s=deps.settings.tool_timeout_s,
        system_prompt=agent.spec.instructions,
        attempt=run["attempt"],
        context_setup=context_setup(
            agent, run, models=deps.models, settings=deps.settings, pool=deps.pool, caller=caller
        ),
    )
    state = await deps.graph.aget_state(config)
    graph_input: dict[str, Any] | Command[Any] | None
    resuming = state.values.get("run_id") == run_id
    checkpointed = state.values.get("messages", []) if resuming else []
    # Tasks of the next step that finished before the crash: LangGraph restores their saved
    # writes instead of running them again, so their answers count as saved too.
    saved = [*checkpointed, *_task_messages(state.tasks)] if resuming else []
    projector.supersede_unsaved(saved, run["input_message_id"], recorded)
    if resuming:
        graph_input = None  # resume this run from its last checkpoint
        projector.replay_missing(checkpointed, run["input_message_id"], recorded)
        if state.interrupts:
            graph_input = await resume_command(deps.pool, run_id, state.interrupts)
            if graph_input is None:  # decisions still missing: ask (again) and wait
                return state.interrupts
    else:
        content = run.get("input_content")
        if content is None:
            async with deps.pool.connection() as conn:
                content = await _load_input(conn, run["input_message_id"])
        graph_input = {
            "messages": [
                *close_unanswered_calls(state.values.get("messages", [])),
                HumanMessage(content, id=run["input_message_id"]),
            ],
            "run_id": run_id,
            "step": 0,
        }
    # `next` leaves out tasks whose writes were saved before a crash; those still lead on.
    if graph_input is None and not state.next and not state.tasks:
        return ()  # the graph finished before the previous attempt could record it
    # "sync": each step's checkpoint is stored before the next step starts, so no tool runs
    # for a model turn that is not checkpointed, and a failed write stops the attempt there.
    async for mode, chunk in deps.graph.astream(
        graph_input,
        config,
        context=context,
        stream_mode=STREAM_MODES,
        control=handle.control,
        durability="sync",
    ):
        projector.handle(mode, chunk)
    return (await deps.graph.aget_state(config)).interrupts


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


async def _finish(writer: EventWriter, kind: str, data: dict[str, Any], extra: Any = None) -> None:
    try:
        await writer.finish(kind, data, extra)
    except (LeaseLostError, RunFinishedError) as exc:
        log.info("run %s: %s not stored: %s", writer.run_id, kind, exc)
    finally:
        await writer.close()


async def _complete(writer: EventWriter, run: dict[str, Any]) -> None:
    await writer.flush()
    message_id = new_id("msg")
    output = output_text(writer.head.snapshot)

    async def store_message(conn: Conn, head: RunHead) -> None:
        await conn.execute(
            "INSERT INTO messages (id, conversation_id, tenant_id, user_id, run_id, role, content)"
            " VALUES (%s, %s, %s, %s, %s, 'assistant', %s)",
            (
                message_id,
                run["conversation_id"],
                run["tenant_id"],
                run["user_id"],
                run["id"],
                output,
            ),
        )
        await conn.execute(
            "UPDATE runs SET output_message_id = %s WHERE id = %s", (message_id, run["id"])
        )
        # With the completion, so that a completed run never lacks its extraction job.
        await enqueue_extraction(conn, run)

    await _finish(
        writer, "run.completed", {"outputMessageId": message_id, "output": output}, store_message
    )
