"""Execute one claimed run: drive the compiled graph and turn its stream into events."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphDrained, GraphRecursionError
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl

from graphs.context import RunContext
from nodes.errors import StepLimitError
from server.checkpoint import FENCE_GENERATION, FENCE_RUN
from server.db import Pool
from server.eventlog import Conn, LeaseLostError, RunFinishedError, RunHead
from server.ids import new_id
from server.models import ModelRegistry
from server.projection import STREAM_MODES, StreamProjector
from server.settings import Settings
from server.snapshot import output_text, streaming_item_ids
from server.writer import EventWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecutorDeps:
    """What every run needs from the process: the graph, models, tools and settings."""

    pool: Pool
    graph: CompiledStateGraph[Any, Any, Any, Any]
    models: ModelRegistry
    tools: list[BaseTool]
    settings: Settings


@dataclass
class RunHandle:
    """A worker's grip on one executing run: drain it, or say why it is being cancelled."""

    control: RunControl = field(default_factory=RunControl)
    # Set before task.cancel(): "cancel" (a user asked), "lease_lost", or "shutdown".
    stop_reason: str | None = None


class RunTimeoutError(TimeoutError):
    """The run passed its wall-clock deadline."""


def classify_failure(exc: BaseException) -> tuple[str, str]:
    """Name why a run failed: (error type, message a person can act on)."""
    if isinstance(exc, StepLimitError):
        return exc.reason, str(exc)
    if isinstance(exc, GraphRecursionError):
        return "step_limit", "the graph exceeded its recursion limit without finishing"
    if isinstance(exc, RunTimeoutError):
        return "timeout", str(exc)
    return type(exc).__name__, str(exc) or repr(exc)


async def _load_input(conn: Conn, message_id: str) -> str:
    cur = await conn.execute("SELECT content FROM messages WHERE id = %s", (message_id,))
    row = await cur.fetchone()
    assert row is not None, f"input message {message_id} is missing"
    return str(row["content"])


def _seconds_left(deadline: datetime | None) -> float | None:
    if deadline is None:
        return None
    return (deadline - datetime.now(UTC)).total_seconds()


async def execute_run(
    deps: ExecutorDeps, run: dict[str, Any], head: RunHead, handle: RunHandle | None = None
) -> None:
    """Run the graph for a claimed run until it ends, drains, is cancelled, or loses its lease.

    `head` is the run's head right after the claim stored `run.started`. Whatever happens,
    the run leaves this function terminal, back in the queue, waiting, or (when the lease or
    the database is lost) untouched for the reaper to recover.
    """
    handle = handle or RunHandle()
    run_id = run["id"]
    writer = EventWriter(deps.pool, head)
    projector = StreamProjector(writer.emit)
    for item_id in streaming_item_ids(head.snapshot):
        # An earlier attempt died mid-answer; its partial text is replaced by this attempt's.
        writer.emit(
            "message.item.completed",
            {"itemId": item_id, "status": "superseded", "reason": "attempt abandoned"},
        )
    deadline = asyncio.timeout(_seconds_left(run.get("deadline_at")))
    try:
        async with deadline:
            await _drive(deps, run, projector, handle)
    except asyncio.CancelledError:
        await _on_cancelled(writer, projector, handle)
        raise
    except GraphDrained:
        await _finish(writer, "run.requeued", {"reason": "worker draining"})
        return
    except (LeaseLostError, RunFinishedError):
        log.info("run %s: lease lost; stopped writing (%s)", run_id, writer.error)
        await writer.close()
        return
    except (psycopg.OperationalError, psycopg.errors.ConnectionTimeout) as exc:
        # The database went away mid-step: write nothing more; the lease expires and the run
        # is recovered from its last checkpoint when the database is back.
        log.warning("run %s: database unavailable (%s); leaving it to recovery", run_id, exc)
        await writer.close()
        return
    except Exception as exc:
        if isinstance(exc, TimeoutError) and deadline.expired():
            exc = RunTimeoutError(
                f"the run passed its wall-clock deadline ({run['deadline_at'].isoformat()}); "
                "raise the run option timeoutSeconds or AGENTRT_RUN_TIMEOUT_S"
            )
        projector.close_open_items("interrupted", "run failed")
        error_type, message = classify_failure(exc)
        log.info("run %s failed: %s: %s", run_id, error_type, message)
        await _finish(writer, "run.failed", {"errorType": error_type, "message": message})
        return
    await _complete(writer, run)


async def _drive(
    deps: ExecutorDeps, run: dict[str, Any], projector: StreamProjector, handle: RunHandle
) -> None:
    run_id = run["id"]
    options = run["options"] or {}
    context = RunContext(
        run_id=run_id,
        conversation_id=run["conversation_id"],
        tenant_id=run["tenant_id"],
        user_id=run["user_id"],
        model=deps.models.create(run["model"]),
        tools=deps.tools,
        max_steps=int(options.get("maxSteps") or deps.settings.max_steps),
        tool_timeout_s=deps.settings.tool_timeout_s,
    )
    config: RunnableConfig = {
        "configurable": {
            "thread_id": run["conversation_id"],
            FENCE_RUN: run_id,
            FENCE_GENERATION: run["lease_generation"],
        },
        "recursion_limit": context.max_steps * 3 + 10,
    }
    graph_input: dict[str, Any] | None = None
    # Only an earlier attempt of this run can have left checkpoints of it to resume from.
    state = await deps.graph.aget_state(config) if run["attempt"] > 1 else None
    if state is not None and state.values.get("run_id") == run_id:
        if not state.next:
            return  # the graph finished before the previous attempt could record it
    else:
        content = run.get("input_content")
        if content is None:
            async with deps.pool.connection() as conn:
                content = await _load_input(conn, run["input_message_id"])
        graph_input = {
            "messages": [HumanMessage(content, id=run["input_message_id"])],
            "run_id": run_id,
            "step": 0,
        }
    async for mode, chunk in deps.graph.astream(
        graph_input, config, context=context, stream_mode=STREAM_MODES, control=handle.control
    ):
        projector.handle(mode, chunk)


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

    await _finish(
        writer, "run.completed", {"outputMessageId": message_id, "output": output}, store_message
    )


async def _on_cancelled(writer: EventWriter, projector: StreamProjector, handle: RunHandle) -> None:
    if handle.stop_reason == "cancel":
        projector.close_open_items("interrupted", "run cancelled")
        await _finish(writer, "run.cancelled", {"reason": "cancel requested"})
    elif handle.stop_reason == "shutdown":
        # Hand the run back at once instead of waiting for the lease to expire.
        await _finish(writer, "run.requeued", {"reason": "worker stopped"})
    else:
        log.info("run %s: lease lost; stopped without writing", writer.run_id)
        await writer.close()
