"""The fenced checkpointer writes only while the writer's lease generation is current."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig

from graphs.agent import build_agent_graph
from graphs.context import RunContext
from nodes.models.scripted import ScriptedChatModel, ScriptedTurn
from server.auth import Principal
from server.db.checkpoint import FENCE_GENERATION, FENCE_RUN, FENCE_SQLSTATE
from server.db.pool import Pool
from server.errors import LeaseLostError
from server.events.log import NewEvent, append_events
from server.process import setup_checkpointer
from server.runs.conversations import create_conversation
from server.runs.records import create_run, fence_out, lock_expired_leases
from tests.support.rows import count_rows

WHO = Principal("t", "u")


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
    written = await count_rows(pool, "checkpoints", "thread_id", conv)
    assert written > 0
    async with pool.connection() as conn:  # the fence is not copied into every checkpoint
        cur = await conn.execute(
            "SELECT DISTINCT jsonb_object_keys(metadata) AS key FROM checkpoints"
            " WHERE thread_id = %s",
            (conv,),
        )
        assert {r["key"] for r in await cur.fetchall()} == {"step", "source", "parents"}

    async with pool.connection() as conn:  # another worker takes the run over
        await conn.execute("UPDATE runs SET lease_generation = 2 WHERE id = %s", (run.id,))
    with pytest.raises(LeaseLostError, match="lease generation 1 superseded"):
        await graph.ainvoke(state, config(1), context=RunContext(model=model))
    assert await count_rows(pool, "checkpoints", "thread_id", conv) == written


async def _fenced_write_in_flight(pool: Pool, run_id: str, generation: int) -> Any:
    """Open a connection whose transaction holds the fence, as a checkpoint write does."""
    conn = await pool.getconn()
    await conn.execute("BEGIN")
    await conn.execute("SELECT agentrt_fence(%s, %s)", (run_id, generation))
    return conn


async def test_the_lease_holders_event_append_does_not_wait_for_its_own_checkpoint_write(
    pool: Pool,
) -> None:
    conv = (await create_conversation(pool, WHO, None, None, {}))["id"]
    run = await create_run(pool, WHO, conv, "hi", "scripted:x", {})
    async with pool.connection() as conn:
        await conn.execute("UPDATE runs SET lease_generation = 1 WHERE id = %s", (run.id,))
    writing = await _fenced_write_in_flight(pool, run.id, 1)
    try:
        async with pool.connection() as conn:
            # lock_timeout counts only time spent waiting for a lock, never CPU or I/O.
            await conn.execute("SET lock_timeout = '500ms'")
            _, stored = await append_events(conn, run.id, [NewEvent("note")], generation=1)
            await conn.execute("RESET lock_timeout")
        assert [e.type for e in stored] == ["note"]
    finally:
        await writing.execute("COMMIT")
        await pool.putconn(writing)


async def _expired(pool: Pool) -> str:
    """A running run at lease generation 1 whose lease ran out."""
    conv = (await create_conversation(pool, WHO, None, None, {}))["id"]
    run = await create_run(pool, WHO, conv, "hi", "scripted:x", {})
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE runs SET lease_generation = 1, status = 'running', lease_owner = 'w1',"
            " lease_expires_at = now() - interval '1 minute' WHERE id = %s",
            (run.id,),
        )
    return run.id


async def test_a_takeover_skips_a_run_whose_checkpoint_write_is_in_flight(pool: Pool) -> None:
    run_id = await _expired(pool)
    writing = await _fenced_write_in_flight(pool, run_id, 1)
    try:
        async with pool.connection() as conn, conn.transaction():
            assert run_id not in [r["id"] for r in await lock_expired_leases(conn)]
    finally:
        await writing.execute("COMMIT")
        await pool.putconn(writing)
    async with pool.connection() as conn, conn.transaction():
        assert run_id in [r["id"] for r in await lock_expired_leases(conn)]


async def test_a_fenced_write_in_flight_holds_no_lock_on_the_runs_row(pool: Pool) -> None:
    run_id = await _expired(pool)
    writing = await _fenced_write_in_flight(pool, run_id, 1)
    try:
        async with pool.connection() as conn, conn.transaction():
            # NOWAIT fails at once on any conflicting row lock, a key-share one included.
            await conn.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE NOWAIT", (run_id,))
    finally:
        await writing.execute("COMMIT")
        await pool.putconn(writing)


async def test_a_fenced_write_after_a_recovery_waits_for_it_then_is_refused(pool: Pool) -> None:
    run_id = await _expired(pool)
    reaper = await pool.getconn()
    try:
        await reaper.execute("BEGIN")
        assert run_id in [r["id"] for r in await lock_expired_leases(reaper)]
        await fence_out(reaper, run_id, 1)
        async with pool.connection() as conn:
            # lock_timeout counts only time spent waiting for a lock.
            await conn.execute("SET lock_timeout = '300ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await conn.execute("SELECT agentrt_fence(%s, %s)", (run_id, 1))
            await conn.execute("RESET lock_timeout")
        await reaper.execute("COMMIT")
    finally:
        await pool.putconn(reaper)
    async with pool.connection() as conn:
        with pytest.raises(psycopg.Error) as refused:
            await conn.execute("SELECT agentrt_fence(%s, %s)", (run_id, 1))
        assert refused.value.sqlstate == FENCE_SQLSTATE
        await conn.execute("SELECT agentrt_fence(%s, %s)", (run_id, 2))  # the new generation
