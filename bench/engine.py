"""The engine floor: the same agent graph on LangGraph's own `AsyncPostgresSaver`, in-process.

No HTTP, no queue, no worker, no event log: what a program that embeds LangGraph directly
pays for the same run. Every agentrt figure is compared with this, measured in the same run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Durability
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from graphs.agent import build_agent_graph
from graphs.context import RunContext
from nodes.models.scripted import ScriptedChatModel, ScriptedTurn
from server.db.pool import connection_kwargs
from server.events.projection import STREAM_MODES
from server.ids import new_id
from tools.builtin import calculator

TOOL_TURN: dict[str, Any] = {
    "text": "",
    "tool_calls": [{"name": "calculator", "args": {"expression": "6*7"}}],
}
ANSWER: dict[str, Any] = {"text": "word " * 20, "chunk_chars": 5}  # 20 chunks of 5 characters
AGENT_SCRIPT: list[dict[str, Any]] = [TOOL_TURN, ANSWER]
# The engine's thread ids (and the floors' run ids, their thread ids) start as agentrt's
# conversation ids do. Ids sort in the order they were made, so on the database both sides
# share, each new checkpoint key sorts last in the checkpoint tables' indexes, on either side.
# With another prefix, one side's keys go in the middle of those indexes, where each page
# split moves half a page: 3 to 5 KiB of WAL per run more for agentrt, whose "conv" keys
# sorted before the engine's "floor" ones.
THREAD_PREFIX = "conv"


@dataclass
class Engine:
    """A compiled graph on a pool, with the scripted model and the calculator."""

    graph: CompiledStateGraph[Any, Any, Any, Any]
    model: ScriptedChatModel
    tools: list[BaseTool]
    durability: Durability = "async"  # LangGraph's default; agentrt's executor uses "sync"

    async def run(self) -> tuple[float, float, float]:
        """Run one turn to its end; return seconds to the first part, first token, and end."""
        started = time.perf_counter()
        first = token = 0.0
        config: RunnableConfig = {"configurable": {"thread_id": new_id(THREAD_PREFIX)}}
        context = RunContext(model=self.model, tools=self.tools)
        graph_input: dict[str, Any] = {
            "messages": [HumanMessage("go")],
            "run_id": "floor",
            "step": 0,
        }
        async for part in self.graph.astream(
            graph_input,
            config,
            context=context,
            stream_mode=STREAM_MODES,
            durability=self.durability,
        ):
            if not first:
                first = time.perf_counter() - started
            if not token and part[0] == "messages" and part[1][0].content:
                token = time.perf_counter() - started
        return first, token, time.perf_counter() - started

    async def throughput(self, runs: int, concurrency: int) -> tuple[list[float], float]:
        """Run `runs` runs, `concurrency` at a time; return per-run latencies and runs/s."""
        gate = asyncio.Semaphore(concurrency)
        latencies: list[float] = []

        async def one() -> None:
            async with gate:
                latencies.append((await self.run())[2])

        started = time.perf_counter()
        async with asyncio.timeout(600):
            await asyncio.gather(*(one() for _ in range(runs)))
        return latencies, runs / (time.perf_counter() - started)


@asynccontextmanager
async def engine(
    database_url: str,
    script: list[dict[str, Any]] | None = None,
    pool_max: int = 20,
    saver: type[AsyncPostgresSaver] = AsyncPostgresSaver,
) -> AsyncIterator[Engine]:
    """Open a pool (sized like the server's), set up the checkpointer, compile the graph.

    `saver` is LangGraph's saver or a subclass of it (bench/floor_worker.py fences its writes).
    """
    pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
        database_url, min_size=2, max_size=pool_max, kwargs=connection_kwargs(), open=False
    )
    await pool.open(wait=True, timeout=30)
    try:
        checkpointer = saver(pool)  # type: ignore[arg-type]
        await checkpointer.setup()
        graph = build_agent_graph().compile(checkpointer=checkpointer)
        turns = [ScriptedTurn.model_validate(t) for t in (script or AGENT_SCRIPT)]
        yield Engine(graph, ScriptedChatModel(turns=turns), [calculator])
    finally:
        await pool.close()
