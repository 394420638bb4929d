"""Checkpoint retention keeps the latest checkpoint of idle conversations, and only that."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from langchain_core.runnables import RunnableConfig

from nodes.models.scripted import ScriptedTurn
from server.app import build_tool_registry
from server.auth import Principal
from server.db.maintenance import prune_checkpoints
from server.events.log import load_head
from server.process import Runtime, open_runtime
from server.runs.conversations import create_conversation
from server.runs.records import create_run
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.rows import count_rows

WHO = Principal("t", "u")


@pytest.fixture(scope="module")
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    models = ModelRegistry(settings, {"hi": [ScriptedTurn(text="hello")]})
    async with open_runtime(
        settings, models, build_tool_registry(settings, []), run_workers=True
    ) as rt:
        yield rt


async def run_to_end(runtime: Runtime, conv: str) -> None:
    run = await create_run(runtime.pool, WHO, conv, "hi", "scripted:hi", {})
    async with runtime.pool.connection() as conn:
        with runtime.notifier.watch_run(run.id) as wake:
            while (await load_head(conn, run.id, lock=False)).status != "completed":
                await wake.wait()
                wake.clear()


async def test_prune_keeps_the_latest_checkpoint_and_the_conversation_continues(
    runtime: Runtime,
) -> None:
    idle = (await create_conversation(runtime.pool, WHO, None, None, {}))["id"]
    recent = (await create_conversation(runtime.pool, WHO, None, None, {}))["id"]
    for conv in (idle, idle, recent):
        await run_to_end(runtime, conv)
    assert await count_rows(runtime.pool, "checkpoints", "thread_id", idle) > 1
    config: RunnableConfig = {"configurable": {"thread_id": idle}}
    before = (await runtime.graph.aget_state(config)).values

    # Retention 0 days: everything finished is old enough, nothing in progress is touched.
    pruned = await prune_checkpoints(runtime.pool, runtime.checkpointer, retention_days=0)

    assert pruned >= 2
    assert await count_rows(runtime.pool, "checkpoints", "thread_id", idle) == 1
    assert await count_rows(runtime.pool, "checkpoints", "thread_id", recent) == 1
    after = (await runtime.graph.aget_state(config)).values
    assert after["messages"] == before["messages"]
    await run_to_end(runtime, idle)  # the next message resumes from the kept checkpoint
    final = (await runtime.graph.aget_state(config)).values
    assert len(final["messages"]) == len(before["messages"]) + 2


async def test_prune_leaves_recent_conversations_alone(runtime: Runtime) -> None:
    conv = (await create_conversation(runtime.pool, WHO, None, None, {}))["id"]
    await run_to_end(runtime, conv)
    await run_to_end(runtime, conv)
    count = await count_rows(runtime.pool, "checkpoints", "thread_id", conv)
    await prune_checkpoints(runtime.pool, runtime.checkpointer, retention_days=1)
    assert await count_rows(runtime.pool, "checkpoints", "thread_id", conv) == count
