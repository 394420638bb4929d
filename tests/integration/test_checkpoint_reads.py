"""An attempt's two reads of its thread's latest checkpoint cost one round trip."""

from __future__ import annotations

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig

from graphs.agent import build_agent_graph
from graphs.context import RunContext
from nodes.models.scripted import ScriptedChatModel, ScriptedTurn
from server.db.checkpoint import FencedPostgresSaver, reusing_reads
from server.db.pool import Pool
from server.ids import new_id
from server.process import setup_checkpointer


async def _thread_with_a_checkpoint(saver: FencedPostgresSaver) -> RunnableConfig:
    graph = build_agent_graph().compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": new_id("conv")}}
    model = ScriptedChatModel(turns=[ScriptedTurn(text="hello")])
    state = {"messages": [HumanMessage("hi")], "run_id": "r", "step": 0}
    await graph.ainvoke(state, config, context=RunContext(model=model))
    return config


async def test_the_latest_checkpoint_is_served_once_more_then_read_again(pool: Pool) -> None:
    saver = await setup_checkpointer(pool)
    config = await _thread_with_a_checkpoint(saver)
    other = await _thread_with_a_checkpoint(saver)
    thread = str(config["configurable"]["thread_id"])
    with reusing_reads(thread):
        first = await saver.aget_tuple(config)
        assert first is not None
        assert await saver.aget_tuple(other) is not await saver.aget_tuple(other)
        assert await saver.aget_tuple(config) is first  # the loop's read: from memory
        third = await saver.aget_tuple(config)  # anything later is read from the database
        assert third is not first and third is not None
        assert third.config == first.config
    outside = [await saver.aget_tuple(config) for _ in range(2)]
    assert outside[0] is not outside[1]


async def test_a_checkpoint_with_pending_writes_is_never_reused(pool: Pool) -> None:
    saver = await setup_checkpointer(pool)
    config = await _thread_with_a_checkpoint(saver)
    latest = await saver.aget_tuple(config)
    assert latest is not None
    await saver.aput_writes(latest.config, [("messages", [])], new_id("task"))
    with reusing_reads(str(config["configurable"]["thread_id"])):
        first = await saver.aget_tuple(config)
        assert first is not None and first.pending_writes
        assert await saver.aget_tuple(config) is not first


async def test_a_thread_known_to_have_no_checkpoint_is_read_by_neither(pool: Pool) -> None:
    saver = await setup_checkpointer(pool)
    config = await _thread_with_a_checkpoint(saver)
    # The caller says the thread has none (its claim looked): the state's read and the loop's
    # are both served "none", so a checkpoint stored meanwhile is not seen by either.
    with reusing_reads(str(config["configurable"]["thread_id"]), stored=False):
        assert await saver.aget_tuple(config) is None
        assert await saver.aget_tuple(config) is None
        assert await saver.aget_tuple(config) is not None  # anything later: from the database
