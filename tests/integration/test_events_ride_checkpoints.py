"""When the event writer stores what: a step's reports ride the next checkpoint write.

The writer holds events of its `CARRIED` types for a moment; a fenced checkpoint write of the
run takes them into its own transaction. Nothing is lost, stored twice or reordered when that
transaction is refused or broken off. Pieces of a stream (`PACED`) are stored together, at
most once per pace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.rows import dict_row

from graphs.events import EventType
from server.db.checkpoint import FENCE_GENERATION, FENCE_RIDER, FENCE_RUN, FencedPostgresSaver
from server.db.pool import Pool, retry_deadlocks
from server.errors import LeaseLostError
from server.events.log import NewEvent, RunHead, append_events, load_head
from server.events.writer import EventWriter
from server.process import setup_checkpointer
from server.skills.usage import SKILL_LOADS
from tests.integration.test_eventlog import claim, new_run
from tests.integration.test_pipelined_transaction import traced

pytestmark = pytest.mark.timeout(120)

BUILT = EventType.SKILL_LOADED  # a carried type with no fold or trigger of its own
NOTE = "note"  # neither carried nor paced: stored at once
PIECE = EventType.MESSAGE_ITEM_DELTA


async def _claimed(pool: Pool) -> tuple[str, RunHead]:
    """A run leased and started as a worker does: a checkpoint thread of its own, and its head."""
    run_id = await new_run(pool)
    await claim(pool, run_id)
    async with pool.connection() as conn:
        return f"thread-{run_id}", await load_head(conn, run_id, lock=False)


@contextlib.asynccontextmanager
async def _riding(
    pool: Pool,
) -> AsyncIterator[tuple[FencedPostgresSaver, str, RunHead, EventWriter]]:
    """A claimed run's saver, thread, head, and a writer whose reports wait for a checkpoint."""
    saver = await setup_checkpointer(pool)
    conv, head = await _claimed(pool)
    writer = EventWriter(pool, head, linger_s=600)
    try:
        yield saver, conv, head, writer
    finally:
        await writer.close()


def _config(conv: str, head: RunHead, writer: EventWriter | None) -> RunnableConfig:
    configurable: dict[str, Any] = {
        "thread_id": conv,
        "checkpoint_ns": "",
        FENCE_RUN: head.run_id,
        FENCE_GENERATION: head.generation,
    }
    if writer is not None:
        configurable[FENCE_RIDER] = writer
    return {"configurable": configurable}


async def _put(saver: FencedPostgresSaver, config: RunnableConfig) -> None:
    await saver.aput(config, empty_checkpoint(), {}, {})


async def _log(pool: Pool, run_id: str) -> list[tuple[int, str, str]]:
    """The run's events after `run.started`: (seq, type, id of the transaction that stored it)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT seq, type, xmin::text AS tx FROM run_events WHERE run_id = %s AND seq > 2"
            " ORDER BY seq",
            (run_id,),
        )
        return [(r["seq"], r["type"], r["tx"]) for r in await cur.fetchall()]


async def _checkpoint_txs(pool: Pool, conv: str) -> set[str]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT xmin::text AS tx FROM checkpoints WHERE thread_id = %s", (conv,)
        )
        return {r["tx"] for r in await cur.fetchall()}


async def _until(check: Any, deadline_s: float = 60.0) -> None:
    async with asyncio.timeout(deadline_s):
        while not await check():  # noqa: ASYNC110 (state in the database, no event of its own)
            await asyncio.sleep(0.02)


async def test_queued_reports_commit_with_the_runs_next_checkpoint_write(pool: Pool) -> None:
    saver = await setup_checkpointer(pool)
    conv, head = await _claimed(pool)
    # Only a checkpoint write can carry them; the hook's row goes in the same transaction.
    writer = EventWriter(pool, head, linger_s=600, hooks=[SKILL_LOADS])
    try:
        writer.emit(BUILT, {"name": "a", "version": 1, "hash": "h1"})
        writer.emit(BUILT, {"name": "b", "version": 2, "hash": "h2"})
        await _put(saver, _config(conv, head, None))  # a write the writer does not ride
        assert await _log(pool, head.run_id) == []

        await _put(saver, _config(conv, head, writer))
        log = await _log(pool, head.run_id)
        assert [(seq, kind) for seq, kind, _ in log] == [(3, BUILT), (4, BUILT)]
        assert {tx for _, _, tx in log} <= await _checkpoint_txs(pool, conv)
        assert writer.head.seq == 4
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT name, event_seq, xmin::text AS tx FROM skill_loads WHERE run_id = %s"
                " ORDER BY name",
                (head.run_id,),
            )
            loads = await cur.fetchall()
        assert [(r["name"], r["event_seq"]) for r in loads] == [("a", 3), ("b", 4)]
        assert {r["tx"] for r in loads} == {tx for _, _, tx in log}

        writer.emit(NOTE)  # the log goes on from the head the checkpoint write left
        await writer.flush()
        assert [(seq, kind) for seq, kind, _ in await _log(pool, head.run_id)][-1] == (5, NOTE)
    finally:
        await writer.close()


async def test_a_report_waits_for_the_next_event_or_the_linger_time_whichever_comes_first(
    pool: Pool,
) -> None:
    _, head = await _claimed(pool)
    writer = EventWriter(pool, head, linger_s=0.3)
    try:
        writer.emit(BUILT, {"n": 1})
        writer.emit(NOTE)  # not carried: both go now, in order, in one transaction
        await writer.flush()
        log = await _log(pool, head.run_id)
        assert [(seq, kind) for seq, kind, _ in log] == [(3, BUILT), (4, NOTE)]
        assert len({tx for _, _, tx in log}) == 1

        writer.emit(BUILT, {"n": 2})  # alone: stored once the linger time is up

        async def stored() -> bool:
            return len(await _log(pool, head.run_id)) == 3

        await _until(stored)
    finally:
        await writer.close()


async def test_the_runs_last_event_takes_the_queued_reports_into_its_transaction(
    pool: Pool,
) -> None:
    _, head = await _claimed(pool)
    writer = EventWriter(pool, head, linger_s=600)
    writer.emit(BUILT, {"n": 1})
    folded = await writer.folded()
    assert folded.seq == head.seq + 1 and writer.head.seq == head.seq  # a preview, not stored
    await writer.finish(EventType.RUN_COMPLETED, {"output": ""})
    await writer.close()
    log = await _log(pool, head.run_id)
    assert [(seq, kind) for seq, kind, _ in log] == [(3, BUILT), (4, EventType.RUN_COMPLETED)]
    assert len({tx for _, _, tx in log}) == 1


async def test_a_flush_during_the_runs_last_event_returns_once_it_is_stored(pool: Pool) -> None:
    _, head = await _claimed(pool)
    writer = EventWriter(pool, head, linger_s=600)
    writer.emit(BUILT, {"n": 1})
    storing, go_on = asyncio.Event(), asyncio.Event()

    async def slow_row(conn: Any, new: RunHead) -> None:  # holds the last event's transaction
        storing.set()
        await go_on.wait()

    finishing = asyncio.ensure_future(writer.finish(EventType.RUN_COMPLETED, {}, slow_row))
    async with asyncio.timeout(60):
        await storing.wait()
    flushing = asyncio.ensure_future(writer.flush())
    go_on.set()
    async with asyncio.timeout(60):
        await finishing
        await flushing
    await writer.close()
    assert [kind for _, kind, _ in await _log(pool, head.run_id)] == [
        BUILT,
        EventType.RUN_COMPLETED,
    ]


async def test_a_refused_checkpoint_write_stores_none_of_the_queued_events(pool: Pool) -> None:
    async with _riding(pool) as (saver, conv, head, writer):
        writer.emit(BUILT, {"n": 1})
        async with pool.connection() as conn:  # another worker takes the run over
            await conn.execute("UPDATE runs SET lease_generation = 2 WHERE id = %s", (head.run_id,))
        with pytest.raises(LeaseLostError):
            await _put(saver, _config(conv, head, writer))
        with pytest.raises(LeaseLostError):  # the writer stops too, and stores nothing
            await writer.flush()
        assert await _log(pool, head.run_id) == []
        assert await _checkpoint_txs(pool, conv) == set()


async def test_events_of_a_checkpoint_write_broken_off_midway_are_stored_once_by_the_writer(
    pool: Pool,
) -> None:
    async with _riding(pool) as (saver, conv, head, writer):
        writer.emit(BUILT, {"n": 1})
        writer.emit(BUILT, {"n": 2})
        async with pool.connection() as locker, locker.transaction():
            # The append in the checkpoint's transaction waits for this row lock...
            await locker.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", (head.run_id,))
            putting = asyncio.ensure_future(_put(saver, _config(conv, head, writer)))
            async with pool.connection() as admin:

                async def killed() -> bool:  # ...and its connection is cut while it waits
                    cur = await admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE %s",
                        ("%UPDATE runs SET%last_event_seq%",),
                    )
                    return bool(await cur.fetchall())

                await _until(killed)
            with pytest.raises(psycopg.OperationalError):
                await putting
        await writer.flush()  # the writer learns the batch was not stored, and stores it
        log = await _log(pool, head.run_id)
        assert [(seq, kind) for seq, kind, _ in log] == [(3, BUILT), (4, BUILT)]
        assert await _checkpoint_txs(pool, conv) == set()
        assert writer.head.seq == 4


async def test_a_checkpoint_write_whose_events_are_refused_is_stored_without_them(
    pool: Pool,
) -> None:
    saver = await setup_checkpointer(pool)
    conv, head = await _claimed(pool)
    writer = EventWriter(pool, head, linger_s=600)
    refuse = (
        "CREATE FUNCTION refuse_reports() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        f" IF NEW.run_id = '{head.run_id}' THEN"
        "  RAISE EXCEPTION 'event log unavailable' USING ERRCODE = '08006'; END IF;"
        " RETURN NEW; END $$"
    )
    async with pool.connection() as conn:
        await conn.execute(refuse)
        await conn.execute(
            "CREATE TRIGGER refuse_reports BEFORE INSERT ON run_events"
            " FOR EACH ROW EXECUTE FUNCTION refuse_reports()"
        )
    try:
        writer.emit(BUILT, {"n": 1})
        # The log refuses the events the write carries: the checkpoint is stored all the same.
        await _put(saver, _config(conv, head, writer))
        assert len(await _checkpoint_txs(pool, conv)) == 1
        assert await _log(pool, head.run_id) == []
    finally:
        # The writer retries its refused events meanwhile: its insert takes the partitions'
        # locks in the other order than the DROP, and Postgres may abort the DROP.
        async def unrefuse() -> None:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("DROP TRIGGER refuse_reports ON run_events")
                await conn.execute("DROP FUNCTION refuse_reports()")

        await retry_deadlocks(unrefuse)
    try:
        await writer.flush()  # the events went back to the writer, which stores them once
        assert [(seq, kind) for seq, kind, _ in await _log(pool, head.run_id)] == [(3, BUILT)]
        assert writer.head.seq == 3
    finally:
        await writer.close()


async def test_pieces_of_a_stream_that_follow_a_batch_closely_are_stored_together(
    pool: Pool,
) -> None:
    _, head = await _claimed(pool)
    writer = EventWriter(pool, head, pace_s=2.0)
    try:
        writer.emit(NOTE)
        await writer.flush()  # a batch just went: the next pieces wait for the pace
        for n in range(5):
            writer.emit(PIECE, {"itemId": "item", "delta": str(n)})
            await asyncio.sleep(0.01)  # room for a writer that stores each piece as it comes

        async def stored() -> bool:
            return len(await _log(pool, head.run_id)) == 2

        await _until(stored)
        log = await _log(pool, head.run_id)
        # Sent together, the five pieces of the item were joined into one delta.
        assert [kind for _, kind, _ in log] == [NOTE, PIECE]
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT data FROM run_events WHERE run_id = %s AND seq = %s",
                (head.run_id, log[1][0]),
            )
            assert await cur.fetchone() == {"data": {"itemId": "item", "delta": "01234"}}
    finally:
        await writer.close()


async def test_the_first_piece_after_a_quiet_spell_is_stored_at_once(pool: Pool) -> None:
    _, head = await _claimed(pool)
    writer = EventWriter(pool, head, pace_s=600)  # far longer than the wait below
    try:
        writer.emit(PIECE, {"itemId": "item", "delta": "first"})

        async def stored() -> bool:
            return len(await _log(pool, head.run_id)) == 1

        await _until(stored)
    finally:
        await writer.close()


async def test_a_checkpoint_write_with_the_runs_events_waits_on_one_round_trip(
    pool: Pool,
) -> None:
    """Nothing of the write is read before its sync, the rider's append included."""
    await setup_checkpointer(pool)  # the checkpoint tables, for the bare saver below
    conv, head = await _claimed(pool)
    writer = EventWriter(pool, head, linger_s=600, hooks=[SKILL_LOADS])
    try:
        writer.emit(BUILT, {"name": "a", "version": 1, "hash": "h1"})
        async with await psycopg.AsyncConnection.connect(
            pool.conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            saver = FencedPostgresSaver(conn)
            sent = await traced(conn, lambda: _put(saver, _config(conv, head, writer)))
        assert [(seq, kind) for seq, kind, _ in await _log(pool, head.run_id)] == [(3, BUILT)]
        # Before the one Sync, no Flush: no result was waited for.
        assert sent.count("Sync") == 1, sent
        assert "Flush" not in sent[: sent.index("Sync")], sent
    finally:
        await writer.close()


async def test_a_checkpoint_write_whose_events_lost_the_race_for_the_log_is_stored_alone(
    pool: Pool,
) -> None:
    """Someone appended after the writer's head: the rider's append raises at the sync."""
    async with _riding(pool) as (saver, conv, head, writer):
        writer.emit(BUILT, {"n": 1})
        async with pool.connection() as conn:  # under the same lease, behind the writer's back
            await append_events(conn, head.run_id, [NewEvent(NOTE)], generation=head.generation)
        await _put(saver, _config(conv, head, writer))
        assert len(await _checkpoint_txs(pool, conv)) == 1
        assert [(seq, kind) for seq, kind, _ in await _log(pool, head.run_id)] == [(3, NOTE)]
        with pytest.raises(LeaseLostError):  # the writer finds the log moved, and stops
            await writer.flush()
        assert [(seq, kind) for seq, kind, _ in await _log(pool, head.run_id)] == [(3, NOTE)]
