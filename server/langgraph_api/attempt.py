"""One attempt at a run started through the LangGraph API, on any graph of `langgraph.json`.

It is an `Attempt` (lease, deadline, drain, cancel and outcome are the same) whose graph,
input and stream modes come from the run's `langgraph` options. Every stream part is stored
as a `graph.chunk` event, so the API's SSE is a view of the run's durable log. A crashed
attempt's successor resumes from the last checkpoint this run wrote (LangGraph records the
run id in each checkpoint's metadata).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, Interrupt

from graphs.events import EventType
from nodes.models.usage import RunTotals, UsageMeter
from server.errors import UnknownGraphError
from server.events.projection import STREAM_MODES
from server.langgraph_api.parts import StreamParts, graph_events
from server.langgraph_api.rollback import delete_run_checkpoints
from server.langgraph_api.serde import to_json
from server.langgraph_api.usage import UsageCallbackHandler
from server.runs.attempt import Attempt, GraphInput
from server.usage.budgets import run_budget

# What a resumed attempt must not store twice: the last root `values` part this run stored,
# and the checkpoint id of its last root `checkpoints` part and `debug` checkpoint part. The
# bound on `ts` lets Postgres skip the daily partitions from before the run.
_LAST_PART = """
SELECT {pick} FROM run_events
WHERE run_id = %(run)s AND type = %(type)s AND data ->> 'ns' = '' AND {which}
  AND ts >= (SELECT created_at - interval '1 day' FROM runs WHERE id = %(run)s)
ORDER BY seq DESC LIMIT 1
"""
_STORED = (
    "SELECT ("
    + _LAST_PART.format(pick="data -> 'data'", which="data ->> 'mode' = 'values'")
    + ") AS values_data, ("
    + _LAST_PART.format(
        pick="data -> 'data' -> 'config' -> 'configurable' ->> 'checkpoint_id'",
        which="data ->> 'mode' = 'checkpoints'",
    )
    + ") AS checkpoint_id, ("
    + _LAST_PART.format(
        pick="data -> 'data' -> 'payload' -> 'config' -> 'configurable' ->> 'checkpoint_id'",
        which="data ->> 'mode' = 'debug' AND data -> 'data' ->> 'type' = 'checkpoint'",
    )
    + ") AS debug_checkpoint_id"
)


@dataclass
class _Stored:
    """The parts of a resumed run's log that LangGraph streams again on resume.

    LangGraph hands a step's `values` part to the stream after writing the step's checkpoint,
    and its `checkpoints` part (with its `debug` form) when it starts the next step (or finds
    none: the graph has finished); on resume it streams both again for the checkpoint it
    resumes from, a finished graph's last one included. The predecessor may have died
    before storing them, or after: each is stored again only if the log does not end with it.
    """

    values: Any = None
    checkpoint_id: str | None = None
    debug_checkpoint_id: str | None = None

    def stored(self, mode: str, chunk: Any) -> bool:
        """Whether a root part is the stored one again; each is matched at most once."""
        if mode == "values" and self.values is not None:
            seen, self.values = self.values, None
            return bool(to_json(chunk) == seen)
        if mode == "checkpoints" and self.checkpoint_id is not None:
            seen_id, self.checkpoint_id = self.checkpoint_id, None
            return _checkpoint_id(chunk) == seen_id
        if (
            mode == "debug"
            and self.debug_checkpoint_id is not None
            and isinstance(chunk, dict)
            and chunk.get("type") == "checkpoint"
        ):
            seen_id, self.debug_checkpoint_id = self.debug_checkpoint_id, None
            return _checkpoint_id(chunk.get("payload")) == seen_id
        return False


def _checkpoint_id(payload: Any) -> str | None:
    """The checkpoint id of a `checkpoints` part's payload."""
    if not isinstance(payload, dict):
        return None
    found = ((payload.get("config") or {}).get("configurable") or {}).get("checkpoint_id")
    return str(found) if found is not None else None


class GraphAttempt(Attempt):
    """An attempt whose graph and input are those of a LangGraph API run."""

    async def _drive(self, callbacks: list[BaseCallbackHandler]) -> Sequence[Interrupt]:
        params: dict[str, Any] = self.run.options["langgraph"]
        registry = self.deps.graphs
        entry = registry.get(params["graph_id"]) if registry is not None else None
        if registry is None or entry is None:
            raise UnknownGraphError(params["graph_id"])
        if not entry.own:  # the own agent's model caller meters its calls itself
            callbacks = [*callbacks, self._usage_handler()]
            self.deps.models.prefetch_prices()
        config = self._graph_config(callbacks, params)
        graph = await registry.compiled(entry, config)
        thread: RunnableConfig = {"configurable": dict(config["configurable"])}
        thread["configurable"].pop("checkpoint_id", None)
        latest = await graph.aget_state(thread)
        graph_input: GraphInput
        parts = StreamParts(
            params.get("stream_mode") or ["values"], bool(params.get("stream_subgraphs"))
        )
        # Resuming streams the checkpoint's parts again: stored only when the log lacks them.
        replayed = _Stored()
        if (latest.metadata or {}).get("run_id") == self.run.id:
            # An earlier attempt of this run checkpointed: continue from there.
            replayed = await self._stored()
            if latest.interrupts:
                # Resuming would run the interrupted step: the run waits for its decision.
                if not replayed.stored("values", latest.values):
                    for data in parts.payloads((), "values", latest.values):
                        self.emit(EventType.GRAPH_CHUNK, data)
                return latest.interrupts
            # A graph that had finished is resumed too: LangGraph runs no step and writes no
            # checkpoint, but streams the last checkpoint's `values` and `checkpoints` parts
            # (and their `debug` forms) again, which a worker killed before storing them lost.
            graph_input, config = None, {**config, "configurable": thread["configurable"]}
        else:
            # `rollback`: the runs it interrupted (all finished by now) leave no checkpoint.
            await delete_run_checkpoints(
                self.deps.pool, self.run.conversation_id, params.get("rollback_runs") or []
            )
            graph_input = self._input(params)
        context: Any = params.get("context")
        modes: set[Any] = parts.astream_modes
        if entry.own:
            agent, overlay = self._starts_from()
            context = await self._context(agent, overlay)
            if isinstance(graph_input, dict):
                graph_input = {**graph_input, "run_id": self.run.id, "step": 0}
        options: dict[str, Any] = {
            "context": context,
            "stream_mode": sorted(modes | (set(STREAM_MODES) if entry.own else set())),
            "interrupt_before": params.get("interrupt_before"),
            "interrupt_after": params.get("interrupt_after"),
            "control": self.handle.control,
            "durability": params.get("durability") or "sync",
        }
        stream = (
            graph_events(graph, graph_input, config, **options)
            if parts.events
            else graph.astream(graph_input, config, subgraphs=True, **options)
        )
        async for ns, mode, chunk in stream:
            if entry.own and not ns:
                self.projector.handle(mode, chunk)
            if not ns and replayed.stored(mode, chunk):
                continue
            for data in parts.payloads(ns, mode, chunk):
                self.emit(EventType.GRAPH_CHUNK, data)
        interrupts = (await graph.aget_state(thread)).interrupts
        if interrupts:
            self.emit(EventType.GRAPH_INTERRUPTED, {"interrupts": to_json(list(interrupts))})
        return ()

    async def _stored(self) -> _Stored:
        """Return what this run's log ends with, of the parts LangGraph streams on resume."""
        async with self.deps.pool.connection() as conn:
            cur = await conn.execute(
                _STORED, {"run": self.run.id, "type": EventType.GRAPH_CHUNK.value}
            )
            row = await cur.fetchone()
        assert row is not None  # one row, of NULLs where none was stored
        return _Stored(row["values_data"], row["checkpoint_id"], row["debug_checkpoint_id"])

    def _usage_handler(self) -> UsageCallbackHandler:
        budget = run_budget(self.run.options, self.deps.settings)
        meter = UsageMeter(self.deps.models.pricer, budget, RunTotals.from_json(self.run.usage))
        return UsageCallbackHandler(meter, self.emit, self.run.attempt)

    def _input(self, params: dict[str, Any]) -> GraphInput:
        command = params.get("command")
        if command:
            return Command(
                resume=command.get("resume"),
                update=command.get("update"),
                goto=command.get("goto") or (),
            )
        return params.get("input")

    def _graph_config(
        self, callbacks: list[BaseCallbackHandler], params: dict[str, Any]
    ) -> RunnableConfig:
        given: dict[str, Any] = dict(params.get("config") or {})
        configurable = {
            **(given.get("configurable") or {}),
            "thread_id": self.run.conversation_id,
            **self._fence(),
        }
        if params.get("checkpoint_id"):
            configurable["checkpoint_id"] = params["checkpoint_id"]
        metadata = {
            **(given.get("metadata") or {}),
            **(params.get("metadata") or {}),
            "run_id": self.run.id,
            "graph_id": params["graph_id"],
            "assistant_id": params.get("assistant_id"),
        }
        config: RunnableConfig = {
            "configurable": configurable,
            "metadata": metadata,
            "callbacks": callbacks,
        }
        if given.get("tags"):
            config["tags"] = list(given["tags"])
        if given.get("recursion_limit"):
            config["recursion_limit"] = int(given["recursion_limit"])
        return config
