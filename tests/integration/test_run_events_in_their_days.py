"""A run's events are read from the days of its lifetime, whatever the log's partitions.

Reads of a run's log (a replay, the fold of a stored snapshot's tail, the claim's tail, the
writer's check after a commit in doubt) go through `agentrt_run_events`, which bounds `ts`
by the run's lifetime with values its plan starts with (docs/decisions/2058).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from graphs.events import EventType
from server.db.pool import Pool
from server.events.log import NewEvent, append_events, load_head, read_events
from server.events.writer import _stored_here
from server.lifecycle.retention import ensure_partitions
from tests.integration.test_eventlog import claim, new_run

pytestmark = pytest.mark.timeout(120)


async def _spread_over_three_days(pool: Pool, run_id: str) -> None:
    """Make the run two days old, with events on each of its three days."""
    async with pool.connection() as conn:
        await ensure_partitions(conn, datetime.now(UTC).date() - timedelta(days=30), 40, 5.0)
        await conn.execute(
            "UPDATE runs SET created_at = now() - interval '2 days' WHERE id = %s", (run_id,)
        )
        await conn.execute(
            "UPDATE run_events SET ts = now() - interval '2 days' WHERE run_id = %s", (run_id,)
        )
        await conn.execute(
            "INSERT INTO run_events (run_id, seq, type, ts, data)"
            " SELECT %s, 1 + s, 'graph.chunk', now() - make_interval(days => 2 - s),"
            " jsonb_build_object('n', s) FROM generate_series(1, 2) s",
            (run_id,),
        )
        await conn.execute("UPDATE runs SET last_event_seq = 3 WHERE id = %s", (run_id,))


async def test_a_replay_reads_every_day_of_a_runs_life_and_its_fold_takes_them(
    pool: Pool,
) -> None:
    run_id = await new_run(pool)
    await _spread_over_three_days(pool, run_id)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM pg_inherits WHERE inhparent = 'run_events'::regclass"
        )
        assert (await cur.fetchone())["n"] >= 40
        events = await read_events(conn, run_id, 0, 100)
        assert [(seq, kind) for seq, kind, _ in events] == [
            (1, "run.created"),
            (2, "graph.chunk"),
            (3, "graph.chunk"),
        ]
        assert [json.loads(e[2])["data"] for e in events[1:]] == [{"n": 1}, {"n": 2}]
        # A page, and a page after a seq.
        assert [e[0] for e in await read_events(conn, run_id, 0, 2)] == [1, 2]
        assert [e[0] for e in await read_events(conn, run_id, 2, 100)] == [3]
        # No snapshot is stored at a run's creation: its head folds all three events, and
        # fails if the read misses one.
        head = await load_head(conn, run_id, lock=False)
        assert head.seq == 3
        assert head.snapshot["status"] == "queued"


async def test_a_run_that_is_gone_reads_no_event(pool: Pool) -> None:
    async with pool.connection() as conn:
        assert await read_events(conn, "run_that_never_was", 0, 100) == []


async def test_the_read_keeps_its_generic_plan(pool: Pool) -> None:
    """A custom plan would be made again at every call: the function keeps the generic one."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT proconfig FROM pg_proc WHERE proname = 'agentrt_run_events'"
        )
        assert (await cur.fetchone())["proconfig"] == ["plan_cache_mode=force_generic_plan"]


async def test_the_writers_check_after_a_commit_in_doubt_finds_the_batch(pool: Pool) -> None:
    """After a commit whose outcome was lost, the writer reads whether its batch is stored."""
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    batch = [NewEvent(EventType.GRAPH_CHUNK, {"n": 1}), NewEvent(EventType.GRAPH_CHUNK, {"n": 2})]
    async with pool.connection() as conn:
        before = await load_head(conn, run_id, lock=False)
        after, _ = await append_events(conn, run_id, batch, generation=generation, head=before)
        assert await _stored_here(conn, before, batch, after.seq)
        other = [NewEvent(EventType.RUN_COMPLETED, {})]
        assert not await _stored_here(conn, before, other, after.seq)
