"""Our checkpointers store what LangGraph's own would, serialising on the event loop.

`InlinePostgresSaver` (and `FencedPostgresSaver`, built on it) writes checkpoints and task
writes with its own copies of `AsyncPostgresSaver.aput` and `aput_writes` (without their
thread hop). These tests hand each class and LangGraph's the same checkpoint and the same
writes, on two threads of one database, and compare every stored row: a LangGraph upgrade
that changes what the base class stores fails here.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import WRITES_IDX_MAP, Checkpoint, empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

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
