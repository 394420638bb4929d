"""Execute one claimed run: drive the compiled graph and turn its stream into events."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphRecursionError
from langgraph.graph.state import CompiledStateGraph

from graphs.context import RunContext
from nodes.errors import BudgetExceededError, ModelCallFailedError, StepLimitError
from nodes.models.usage import Budget
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


def classify_failure(exc: BaseException) -> tuple[str, str, dict[str, Any]]:
    """Name why a run failed: (error type, message a person can act on, details).

    A failed model call details its error class, provider, model, attempts and last status
    code; an exhausted budget names the limit, what it allowed and what was used.
    """
    if isinstance(exc, StepLimitError):
        return exc.reason, str(exc), {}
    if isinstance(exc, ModelCallFailedError | BudgetExceededError):
        return exc.reason, str(exc), dict(exc.details)
    if isinstance(exc, GraphRecursionError):
        return "step_limit", "the graph exceeded its recursion limit without finishing", {}
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


async def _load_input(conn: Conn, message_id: str) -> str:
    cur = await conn.execute("SELECT content FROM messages WHERE id = %s", (message_id,))
    row = await cur.fetchone()
    assert row is not None, f"input message {message_id} is missing"
    return str(row["content"])


async def execute_run(deps: ExecutorDeps, run: dict[str, Any], head: RunHead) -> None:
    """Run the graph for a claimed run until it ends, is cancelled, or loses its lease.

    `head` is the run's head right after the claim stored `run.started`. A cancellation that
    comes from a cancel request ends the run `cancelled`; any other (shutdown) propagates and
    leaves the run to be re-queued.
    """
    run_id = run["id"]
    writer = EventWriter(deps.pool, head)
    projector = StreamProjector(writer.emit)
    for item_id in streaming_item_ids(head.snapshot):
        # An earlier attempt died mid-answer; its partial text is replaced by this attempt's.
        writer.emit(
            "message.item.completed",
            {"itemId": item_id, "status": "superseded", "reason": "attempt abandoned"},
        )
    options = run["options"] or {}
    max_steps = int(options.get("maxSteps") or deps.settings.max_steps)
    config: RunnableConfig = {
        "configurable": {"thread_id": run["conversation_id"]},
        "recursion_limit": max_steps * 3 + 10,
    }
    try:
        # Inside the try: a model id that stopped being valid since the request (settings
        # changed) fails the run instead of crashing the worker over and over.
        context = RunContext(
            run_id=run_id,
            conversation_id=run["conversation_id"],
            tenant_id=run["tenant_id"],
            user_id=run["user_id"],
            model_caller=deps.models.caller(
                run["model"],
                budget=run_budget(options, deps.settings),
                totals=head.snapshot.get("usage"),
            ),
            tools=deps.tools,
            max_steps=max_steps,
            tool_timeout_s=deps.settings.tool_timeout_s,
        )
        state = await deps.graph.aget_state(config)
        graph_input: dict[str, Any] | None
        if state.values.get("run_id") == run_id:
            graph_input = None  # resume this run from its last checkpoint
        else:
            async with deps.pool.connection() as conn:
                content = await _load_input(conn, run["input_message_id"])
            graph_input = {
                "messages": [HumanMessage(content, id=run["input_message_id"])],
                "run_id": run_id,
                "step": 0,
            }
        if graph_input is not None or state.next:
            async for mode, chunk in deps.graph.astream(
                graph_input, config, context=context, stream_mode=STREAM_MODES
            ):
                projector.handle(mode, chunk)
    except asyncio.CancelledError:
        await _on_cancelled(deps, writer, projector, run_id)
        raise
    except (LeaseLostError, RunFinishedError):
        log.info("run %s: stopped writing (%s)", run_id, writer.error)
        await writer.close()
        return
    except Exception as exc:
        projector.supersede_open_items("model call failed")
        error_type, message, details = classify_failure(exc)
        log.info("run %s failed: %s: %s", run_id, error_type, message)
        await _finish(
            writer, "run.failed", {"errorType": error_type, "message": message, **details}
        )
        return
    await _complete(deps, writer, run)


async def _finish(writer: EventWriter, kind: str, data: dict[str, Any], extra: Any = None) -> None:
    try:
        await writer.finish(kind, data, extra)
    except (LeaseLostError, RunFinishedError) as exc:
        log.info("run %s: %s not stored: %s", writer.run_id, kind, exc)
    finally:
        await writer.close()


async def _complete(deps: ExecutorDeps, writer: EventWriter, run: dict[str, Any]) -> None:
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


async def _on_cancelled(
    deps: ExecutorDeps, writer: EventWriter, projector: StreamProjector, run_id: str
) -> None:
    async with deps.pool.connection() as conn:
        cur = await conn.execute("SELECT cancel_requested FROM runs WHERE id = %s", (run_id,))
        row = await cur.fetchone()
    if row and row["cancel_requested"]:
        projector.supersede_open_items("run cancelled")
        await _finish(writer, "run.cancelled", {"reason": "cancel requested"})
    else:
        await writer.close()
