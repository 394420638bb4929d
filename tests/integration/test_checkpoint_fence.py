"""The fenced checkpointer writes only while the writer's lease generation is current."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig

from graphs.agent import build_agent_graph
from graphs.context import RunContext
from nodes.models.scripted import ScriptedChatModel, ScriptedTurn
from server.auth import Principal
from server.db.checkpoint import FENCE_GENERATION, FENCE_RUN
from server.db.pool import Pool
from server.errors import LeaseLostError
from server.process import setup_checkpointer
from server.runs.conversations import create_conversation
from server.runs.records import create_run

WHO = Principal("t", "u")


async def checkpoints(pool: Pool, thread: str) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s", (thread,)
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_checkpoints_are_written_with_the_current_generation_and_refused_after_a_takeover(
    pool: Pool,
) -> None:
    saver = await setup_checkpointer(pool)
    graph = build_agent_graph().compile(checkpointer=saver)
    model = ScriptedChatModel(turns=[ScriptedTurn(text="hello")])
    conv = (await create_conversation(pool, WHO, None, None, {}))["id"]
    run = await create_run(pool, WHO, conv, "hi", "scripted:x", {})
    async with pool.connection() as conn:
        await conn.execute("UPDATE runs SET lease_generation = 1 WHERE id = %s", (run.id,))

    def config(generation: int) -> RunnableConfig:
        return {
            "configurable": {"thread_id": conv, FENCE_RUN: run.id, FENCE_GENERATION: generation}
        }

    state = {"messages": [HumanMessage("hi")], "run_id": run.id, "step": 0}
    await graph.ainvoke(state, config(1), context=RunContext(model=model))
    written = await checkpoints(pool, conv)
    assert written > 0

    async with pool.connection() as conn:  # another worker takes the run over
        await conn.execute("UPDATE runs SET lease_generation = 2 WHERE id = %s", (run.id,))
    with pytest.raises(LeaseLostError, match="lease generation 1 superseded"):
        await graph.ainvoke(state, config(1), context=RunContext(model=model))
    assert await checkpoints(pool, conv) == written
