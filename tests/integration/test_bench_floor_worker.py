"""The crash-safe floor (rung L3 of bench/floor.py) keeps the guarantees it stands for.

A floor that skipped a fence or ran a tool twice would be cheaper than what it is compared
with; these check that its worker completes a run with a gapless log and one tool run, and
that an attempt whose lease was taken over can no longer write.
"""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from bench.engine import engine
from bench.floor_log import event_pool
from bench.floor_worker import AttemptWriter, FencedSaver, FloorWorker, accept, create_schema
from server.ids import new_id


async def test_a_queued_run_is_claimed_run_and_logged_once(database_url: str) -> None:
    async with (
        engine(database_url, saver=FencedSaver) as eng,
        event_pool(database_url, max_size=4) as pool,
    ):
        await create_schema(pool)
        worker = FloorWorker(eng, pool, database_url, concurrency=2)
        run_id = new_id("floor")
        await accept(pool, run_id)
        assert await worker.claim_one()
        assert not await worker.claim_one()  # nothing else is queued
        async with asyncio.timeout(60):
            await asyncio.gather(*worker.tasks)
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT seq, data FROM floor_events WHERE run_id = %s ORDER BY seq", (run_id,)
            )
            events = await cur.fetchall()
            cur = await conn.execute(
                "SELECT r.status, r.generation, count(t.*) AS calls FROM floor_runs r"
                " LEFT JOIN floor_tool_calls t ON t.run_id = r.id AND t.result = '42'"
                " WHERE r.id = %s GROUP BY r.status, r.generation",
                (run_id,),
            )
            run = await cur.fetchone()
            # Each step's task writes went in the transaction of the step's checkpoint.
            cur = await conn.execute(
                "SELECT bool_and(w.xmin::text = c.xmin::text) AS together, count(*) AS writes"
                " FROM checkpoint_writes w JOIN checkpoints c ON c.thread_id = w.thread_id"
                " AND c.checkpoint_ns = w.checkpoint_ns"
                " AND c.parent_checkpoint_id = w.checkpoint_id WHERE w.thread_id = %s",
                (run_id,),
            )
            writes = await cur.fetchone()
            # The last checkpoint went in the transaction that ended the run.
            cur = await conn.execute(
                "SELECT (SELECT xmin::text FROM checkpoints WHERE thread_id = %s"
                "        ORDER BY checkpoint_id DESC LIMIT 1)"
                " = (SELECT xmin::text FROM floor_runs WHERE id = %s) AS together",
                (run_id, run_id),
            )
            last = await cur.fetchone()
            # A first attempt's call of a tool safe to run again went in an event batch's.
            cur = await conn.execute(
                "SELECT EXISTS (SELECT 1 FROM floor_events e WHERE e.run_id = t.run_id"
                " AND e.xmin::text = t.xmin::text) AS together"
                " FROM floor_tool_calls t WHERE t.run_id = %s",
                (run_id,),
            )
            call = await cur.fetchone()
    assert call == {"together": True}
    assert writes is not None and writes["together"] is True and writes["writes"] >= 5
    assert last == {"together": True}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = [e["data"]["type"] for e in events]
    assert types[:2] == ["run.created", "run.started"] and types[-1] == "run.completed"
    assert types.count("delta") >= 20
    assert run == {"status": "completed", "generation": 1, "calls": 1}


async def test_an_attempt_whose_lease_was_taken_over_writes_nothing(database_url: str) -> None:
    async with event_pool(database_url, max_size=4) as pool:
        await create_schema(pool)
        run_id = new_id("floor")
        await accept(pool, run_id)
        async with pool.connection() as conn:
            await conn.execute(
                "UPDATE floor_runs SET status = 'running', generation = 2 WHERE id = %s",
                (run_id,),
            )
        stale = AttemptWriter(pool, run_id, generation=1, seq=1)
        with pytest.raises(psycopg.errors.RaiseException, match="moved past generation 1"):
            await stale.commit([json.dumps({"type": "run.started"})])
        current = AttemptWriter(pool, run_id, generation=2, seq=1)
        await current.commit([json.dumps({"type": "run.started"})])
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM floor_events WHERE run_id = %s", (run_id,)
            )
            assert await cur.fetchone() == {"n": 2}
