"""Our checkpointers store what LangGraph's own would, serialising on the event loop.

`InlinePostgresSaver` (and `FencedPostgresSaver`, built on it) writes checkpoints and task
writes with its own copies of `AsyncPostgresSaver.aput` and `aput_writes` (without their
thread hop). These tests hand each class and LangGraph's the same checkpoint and the same
writes, on two threads of one database, and compare every stored row: a LangGraph upgrade
that changes what the base class stores fails here. The versions ours give channels are
shorter than LangGraph's, and a thread moves between the two savers at will.
"""

from __future__ import annotations

import operator
import re
import threading
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import WRITES_IDX_MAP, Checkpoint, empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph

from server.db.checkpoint import FencedPostgresSaver, InlinePostgresSaver
from server.db.pool import Pool
from server.process import setup_checkpointer

# LangGraph's special channels (an error, an interrupt...) are stored at fixed negative
# indexes, by an upsert; the others by an insert.
ERROR = next(channel for channel, idx in WRITES_IDX_MAP.items() if idx == -1)


class ThreadRecordingSerde(JsonPlusSerializer):
    """LangGraph's serializer, noting the threads it ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        self.threads.add(threading.get_ident())
        return super().dumps_typed(obj)


def _checkpoint() -> Checkpoint:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {
        "messages": [HumanMessage("hi", id="m1"), AIMessage("hello", id="m2")],
        "step": 2,
        "run_id": "run_x",
        "summary": None,
    }
    checkpoint["channel_versions"] = {"messages": "2", "step": "2", "run_id": "1", "summary": "1"}
    return checkpoint


async def _store(saver: AsyncPostgresSaver, thread: str, checkpoint: Checkpoint) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    stored = await saver.aput(
        config, checkpoint, {"source": "loop", "step": 2}, {"messages": "2", "step": "2"}
    )
    await saver.aput_writes(
        stored, [("messages", [AIMessage("more", id="m3")]), ("step", 3)], "task-1", "~path"
    )
    await saver.aput_writes(stored, [(ERROR, ValueError("boom"))], "task-2")


async def _rows(pool: Pool, table: str, thread: str, order: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            f"SELECT * FROM {table} WHERE thread_id = %s ORDER BY {order}", (thread,)
        )
        rows = await cur.fetchall()
    return [{k: v for k, v in row.items() if k != "thread_id"} for row in rows]


SAVERS = [InlinePostgresSaver, FencedPostgresSaver]


@pytest.mark.parametrize("saver", SAVERS)
async def test_checkpoints_and_writes_are_stored_as_langgraphs_saver_stores_them(
    pool: Pool, saver: type[InlinePostgresSaver]
) -> None:
    await setup_checkpointer(pool)
    ours = saver(pool)
    theirs = AsyncPostgresSaver(pool)
    checkpoint = _checkpoint()
    mine_thread, base_thread = f"inline-{saver.__name__}", f"inline-base-{saver.__name__}"
    await _store(ours, mine_thread, checkpoint)
    await _store(theirs, base_thread, checkpoint)

    for table, order in (
        ("checkpoints", "checkpoint_id"),
        ("checkpoint_blobs", "channel, version"),
        ("checkpoint_writes", "task_id, idx"),
    ):
        mine = await _rows(pool, table, mine_thread, order)
        base = await _rows(pool, table, base_thread, order)
        assert mine, table
        assert mine == base, table

    # What LangGraph reads back is the same too.
    read: list[Any] = []
    for thread in (mine_thread, base_thread):
        found = await theirs.aget_tuple({"configurable": {"thread_id": thread}})
        assert found is not None
        read.append((found.checkpoint["channel_values"], found.pending_writes))
    assert read[0] == read[1]
    assert read[0][0]["messages"][1].content == "hello"


@pytest.mark.parametrize("saver", SAVERS)
async def test_values_are_serialised_on_the_event_loops_thread(
    pool: Pool, saver: type[InlinePostgresSaver]
) -> None:
    await setup_checkpointer(pool)
    serde = ThreadRecordingSerde()
    await _store(saver(pool, serde=serde), f"inline-thread-{saver.__name__}", _checkpoint())
    assert serde.threads == {threading.get_ident()}


VERSION = re.compile(r"^\d{32}\.[A-Za-z0-9_-]{8}$")


def _counting_graph(saver: AsyncPostgresSaver) -> Any:
    """Two nodes in a loop, three times round at each invocation."""

    class State(TypedDict):
        items: Annotated[list[str], operator.add]
        turns: int

    def first(state: State) -> dict[str, Any]:
        return {"items": [f"a{len(state['items'])}"], "turns": state.get("turns", 0) + 1}

    def second(state: State) -> dict[str, Any]:
        return {"items": [f"b{len(state['items'])}"]}

    graph = StateGraph(State)
    graph.add_node("first", first)
    graph.add_node("second", second)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    graph.add_conditional_edges(
        "second", lambda s: END if s["turns"] % 3 == 0 else "first", [END, "first"]
    )
    return graph.compile(checkpointer=saver)


async def _versions(saver: AsyncPostgresSaver, thread: str) -> list[str]:
    versions = []
    async for found in saver.alist({"configurable": {"thread_id": thread}}):
        versions += found.checkpoint["channel_versions"].values()
        for seen in found.checkpoint["versions_seen"].values():
            versions += seen.values()
    return versions


async def test_channel_versions_are_shorter_and_any_saver_continues_them(pool: Pool) -> None:
    """Our versions order and parse as LangGraph's: a thread moves between savers at will."""
    await setup_checkpointer(pool)
    ours, theirs = InlinePostgresSaver(pool), AsyncPostgresSaver(pool)
    mixed, plain = (
        {"configurable": {"thread_id": "versions-mixed"}},
        {"configurable": {"thread_id": "versions-plain"}},
    )
    # The same three turns: ours, LangGraph's, ours again; and LangGraph's throughout.
    for saver in (ours, theirs, ours):
        mixed_state = await _counting_graph(saver).ainvoke({"items": ["go"]}, mixed)
    for _ in range(3):
        plain_state = await _counting_graph(theirs).ainvoke({"items": ["go"]}, plain)
    assert mixed_state == plain_state
    assert len(mixed_state["items"]) == 21 and mixed_state["turns"] == 9

    fresh = {"configurable": {"thread_id": "versions-ours"}}
    await _counting_graph(ours).ainvoke({"items": ["go"]}, fresh)
    found = await _versions(ours, "versions-ours")
    assert found and all(VERSION.match(v) for v in found), found
    theirs_found = await _versions(theirs, "versions-plain")
    assert min(map(len, theirs_found)) > max(map(len, found))
    # Each next version orders after the one before, whichever saver gives it.
    current = max(found)
    for saver in (ours, theirs, ours):
        following = saver.get_next_version(current, None)
        assert following > current
        current = following
    assert VERSION.match(ours.get_next_version(None, None))
    assert ours.get_next_version(None, None) < ours.get_next_version(7, None)
