"""A run's task writes go in the transaction of the checkpoint that ends their step.

LangGraph stores a task's writes as the task ends and the step's checkpoint right after.
`FencedPostgresSaver` holds a run's regular writes for that checkpoint, up to its hold time,
and stores them first in the checkpoint's transaction; writes to LangGraph's special channels
(an interrupt, an error) go at once, with what was held; held writes whose checkpoint does not
come are stored by themselves. A run's input checkpoint is held, with its writes, for its
first step's checkpoint; the checkpoint of a step the graph says may wait (and the first
step's), for the next checkpoint or the run's next event append, whichever comes first; and
its last checkpoint, when the graph says so, for the transaction that records the run's end.
Writes outside a run are never held.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, create_checkpoint, empty_checkpoint

from graphs.events import EventType
from server.db.checkpoint import (
    FENCE_GENERATION,
    FENCE_LAST,
    FENCE_RUN,
    FencedPostgresSaver,
    LastCheckpoint,
)
from server.db.pool import Pool
from server.errors import LeaseLostError
from server.events.log import RunHead
from server.events.writer import EventWriter
from tests.integration.test_events_ride_checkpoints import _claimed, _log
from tests.support.faults import arm, install_faults

pytestmark = pytest.mark.timeout(120)

INTERRUPT = "__interrupt__"  # LangGraph's channel for an interrupt's writes
ERROR = "__error__"  # LangGraph's channel for a task's error
INPUT: dict[str, Any] = {"source": "input", "step": -1}  # an input checkpoint's metadata
NOTE = "note"  # an event type neither carried nor paced: stored at once


async def _saver(pool: Pool, hold_s: float = 600.0) -> FencedPostgresSaver:
    saver = FencedPostgresSaver(pool, hold_writes_s=hold_s)
    await saver.setup()
    return saver


def _config(conv: str, head: RunHead | None, checkpoint_id: str | None = None) -> RunnableConfig:
    configurable: dict[str, Any] = {"thread_id": conv, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    if head is not None:
        configurable[FENCE_RUN] = head.run_id
        configurable[FENCE_GENERATION] = head.generation
    return {"configurable": configurable}


async def _first(saver: FencedPostgresSaver, conv: str, head: RunHead | None) -> str:
    """Store a thread's first checkpoint; return its id."""
    stored = await saver.aput(_config(conv, head), empty_checkpoint(), {}, {})
    return str(stored["configurable"]["checkpoint_id"])


async def _step(pool: Pool, saver: FencedPostgresSaver) -> tuple[str, RunHead, RunnableConfig]:
    """A claimed run's thread, head, and the config of a step after its first checkpoint."""
    conv, head = await _claimed(pool)
    parent = await _first(saver, conv, head)
    return conv, head, _config(conv, head, parent)


async def _writes(pool: Pool, conv: str) -> list[tuple[str, str, str]]:
    """The thread's stored writes: (task, channel, id of the transaction that stored them)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT task_id, channel, xmin::text AS tx FROM checkpoint_writes"
            " WHERE thread_id = %s ORDER BY task_id, idx",
            (conv,),
        )
        return [(r["task_id"], r["channel"], r["tx"]) for r in await cur.fetchall()]


async def _checkpoint_tx(pool: Pool, conv: str, checkpoint_id: str) -> str:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT xmin::text AS tx FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s",
            (conv, checkpoint_id),
        )
        row = await cur.fetchone()
    assert row is not None
    return str(row["tx"])


async def test_a_runs_task_writes_commit_with_the_checkpoint_that_ends_their_step(
    pool: Pool,
) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    await saver.aput_writes(step, [("messages", ["a"])], "task-a")
    await saver.aput_writes(step, [("messages", ["b"]), ("topic", "t")], "task-b")
    assert await _writes(pool, conv) == []  # held for the step's checkpoint

    stored = await saver.aput(step, create_checkpoint(empty_checkpoint(), None, 1), {}, {})
    tx = await _checkpoint_tx(pool, conv, stored["configurable"]["checkpoint_id"])
    assert await _writes(pool, conv) == [
        ("task-a", "messages", tx),
        ("task-b", "messages", tx),
        ("task-b", "topic", tx),
    ]


async def test_an_interrupt_is_stored_at_once_with_what_was_held_for_its_checkpoint(
    pool: Pool,
) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    await saver.aput_writes(step, [("messages", ["done"])], "task-a")
    await saver.aput_writes(step, [(INTERRUPT, {"value": "approve?"})], "task-b")
    stored = await _writes(pool, conv)
    assert [(task, channel) for task, channel, _ in stored] == [
        ("task-a", "messages"),
        ("task-b", INTERRUPT),
    ]
    assert len({tx for _, _, tx in stored}) == 1  # one transaction


async def test_held_writes_whose_checkpoint_does_not_come_are_stored_by_themselves(
    pool: Pool,
) -> None:
    saver = await _saver(pool, hold_s=0.05)
    conv, _, step = await _step(pool, saver)
    await saver.aput_writes(step, [("messages", ["a"])], "task-a")
    async with asyncio.timeout(60):
        while not await _writes(pool, conv):  # noqa: ASYNC110 (rows, no event of their own)
            await asyncio.sleep(0.02)
    assert [(t, c) for t, c, _ in await _writes(pool, conv)] == [("task-a", "messages")]


async def test_writes_outside_a_run_are_stored_at_once(pool: Pool) -> None:
    saver = await _saver(pool)
    conv = "thread-unfenced"
    parent = await _first(saver, conv, None)
    await saver.aput_writes(_config(conv, None, parent), [("messages", ["a"])], "task-a")
    assert [(t, c) for t, c, _ in await _writes(pool, conv)] == [("task-a", "messages")]


async def test_held_writes_of_a_lost_lease_are_refused_with_the_checkpoint(pool: Pool) -> None:
    saver = await _saver(pool)
    conv, head, step = await _step(pool, saver)
    await saver.aput_writes(step, [("messages", ["late"])], "task-a")
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE runs SET lease_generation = lease_generation + 1 WHERE id = %s",
            (head.run_id,),
        )
    with pytest.raises(LeaseLostError):
        await saver.aput(step, create_checkpoint(empty_checkpoint(), None, 1), {}, {})
    assert await _writes(pool, conv) == []


async def test_a_checkpoint_waits_for_its_writes_stored_after_the_hold(pool: Pool) -> None:
    saver = await _saver(pool, hold_s=0.01)
    conv, head, step = await _step(pool, saver)
    async with pool.connection() as blocker:
        # A takeover's lock on the run's fence: the writes stored after the hold wait on it.
        await blocker.execute("BEGIN")
        await blocker.execute(
            "SELECT pg_advisory_xact_lock(7301, agentrt_fence_key(%s))", (head.run_id,)
        )
        await saver.aput_writes(step, [("messages", ["a"])], "task-a")
        async with asyncio.timeout(60):
            while await _waiting_on_the_fence(pool) < 1:  # noqa: ASYNC110 (a lock wait)
                await asyncio.sleep(0.02)
        put = asyncio.ensure_future(
            saver.aput(step, create_checkpoint(empty_checkpoint(), None, 1), {}, {})
        )
        # The checkpoint waits for those writes in the worker, not beside them at the lock: a
        # write that did not wait would queue there within milliseconds (watched for 1 s).
        loop = asyncio.get_running_loop()
        watch_until = loop.time() + 1.0
        while loop.time() < watch_until:
            assert await _waiting_on_the_fence(pool) == 1
            await asyncio.sleep(0.02)
        assert not put.done()
        await blocker.execute("COMMIT")
    stored = await put
    writes_tx = {int(tx) for _, _, tx in await _writes(pool, conv)}
    checkpoint_tx = int(await _checkpoint_tx(pool, conv, stored["configurable"]["checkpoint_id"]))
    assert len(writes_tx) == 1
    assert writes_tx.pop() < checkpoint_tx  # the writes' transaction came first


async def _checkpoints(pool: Pool, conv: str) -> list[tuple[str, str]]:
    """The thread's stored checkpoints: (source, id of the transaction that stored them)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT metadata->>'source' AS source, xmin::text AS tx FROM checkpoints"
            " WHERE thread_id = %s ORDER BY checkpoint_id",
            (conv,),
        )
        return [(r["source"], r["tx"]) for r in await cur.fetchall()]


async def test_a_runs_input_checkpoint_commits_with_its_first_steps_checkpoint(
    pool: Pool,
) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    base = create_checkpoint(empty_checkpoint(), None, 1)
    stored = await saver.aput(step, base, INPUT, {})
    first = {**step, "configurable": {**step["configurable"], **stored["configurable"]}}
    await saver.aput_writes(first, [("messages", ["go"])], "start")
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None]  # the thread's first only

    after = await saver.aput(first, create_checkpoint(base, None, 2), {"source": "loop"}, {})
    assert after["configurable"]["checkpoint_id"] != stored["configurable"]["checkpoint_id"]
    checkpoints = await _checkpoints(pool, conv)
    assert [s for s, _ in checkpoints] == [None, "input", "loop"]
    tx = checkpoints[-1][1]
    assert checkpoints[1][1] == tx
    assert await _writes(pool, conv) == [("start", "messages", tx)]


async def test_an_input_checkpoint_whose_step_does_not_come_is_stored_with_its_writes(
    pool: Pool,
) -> None:
    saver = await _saver(pool, hold_s=0.05)
    conv, _, step = await _step(pool, saver)
    stored = await saver.aput(step, create_checkpoint(empty_checkpoint(), None, 1), INPUT, {})
    first = {**step, "configurable": {**step["configurable"], **stored["configurable"]}}
    await saver.aput_writes(first, [("messages", ["go"])], "start")
    async with asyncio.timeout(60):
        while not await _writes(pool, conv):  # noqa: ASYNC110 (rows, no event of their own)
            await asyncio.sleep(0.02)
    checkpoints = await _checkpoints(pool, conv)
    assert [s for s, _ in checkpoints] == [None, "input"]
    assert await _writes(pool, conv) == [("start", "messages", checkpoints[-1][1])]


async def test_an_error_of_the_first_task_stores_the_held_input_checkpoint_first(
    pool: Pool,
) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    stored = await saver.aput(step, create_checkpoint(empty_checkpoint(), None, 1), INPUT, {})
    first = {**step, "configurable": {**step["configurable"], **stored["configurable"]}}
    await saver.aput_writes(first, [(ERROR, "bad input")], "start")
    checkpoints = await _checkpoints(pool, conv)
    assert [s for s, _ in checkpoints] == [None, "input"]
    assert await _writes(pool, conv) == [("start", ERROR, checkpoints[-1][1])]


async def test_an_input_checkpoint_outside_a_run_is_stored_at_once(pool: Pool) -> None:
    saver = await _saver(pool)
    conv = "thread-unfenced-input"
    await saver.aput(_config(conv, None), empty_checkpoint(), INPUT, {})
    assert [s for s, _ in await _checkpoints(pool, conv)] == ["input"]


def _with_last(config: RunnableConfig, last: LastCheckpoint) -> RunnableConfig:
    return {**config, "configurable": {**config["configurable"], FENCE_LAST: last}}


LOOP: dict[str, Any] = {"source": "loop", "step": 1}


async def test_the_last_checkpoint_waits_for_the_transaction_that_ends_the_run(
    pool: Pool,
) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    last = LastCheckpoint()
    config = _with_last(step, last)
    await saver.aput_writes(config, [("messages", ["answer"])], "task-a")
    last.expect()
    stored = await saver.aput(config, create_checkpoint(empty_checkpoint(), None, 1), LOOP, {})
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None]  # held, with the writes
    assert await _writes(pool, conv) == []

    write = last.take()
    assert write is not None and last.take() is None  # taken once
    async with pool.connection() as conn, conn.transaction():
        await write(conn)
        cur = await conn.execute("SELECT (txid_current() % 4294967296)::text AS tx")  # an xid
        row = await cur.fetchone()
    assert row is not None
    checkpoints = await _checkpoints(pool, conv)
    assert checkpoints[-1] == ("loop", row["tx"])  # in the run's end's transaction
    assert await _writes(pool, conv) == [("task-a", "messages", row["tx"])]
    assert stored["configurable"]["checkpoint_id"] is not None


async def test_a_checkpoint_the_graph_did_not_call_its_last_is_stored_at_once(
    pool: Pool,
) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    last = LastCheckpoint()
    await saver.aput(
        _with_last(step, last), create_checkpoint(empty_checkpoint(), None, 1), LOOP, {}
    )
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None, "loop"]
    assert last.take() is None


async def test_a_held_last_checkpoint_goes_with_a_checkpoint_that_follows_it_after_all(
    pool: Pool,
) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    last = LastCheckpoint()
    last.expect()
    base = create_checkpoint(empty_checkpoint(), None, 1)
    held = await saver.aput(_with_last(step, last), base, LOOP, {})
    after = {**step, "configurable": {**step["configurable"], **held["configurable"]}}
    await saver.aput(_with_last(after, last), create_checkpoint(base, None, 2), LOOP, {})
    checkpoints = await _checkpoints(pool, conv)
    assert [s for s, _ in checkpoints] == [None, "loop", "loop"]
    assert checkpoints[1][1] == checkpoints[2][1]  # one transaction
    assert last.take() is None  # nothing left for the run's end


async def test_a_held_last_checkpoint_stored_by_itself_is_fenced(pool: Pool) -> None:
    saver = await _saver(pool)
    conv, head, step = await _step(pool, saver)
    last = LastCheckpoint()
    last.expect()
    await saver.aput(
        _with_last(step, last), create_checkpoint(empty_checkpoint(), None, 1), LOOP, {}
    )
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE runs SET lease_generation = lease_generation + 1 WHERE id = %s",
            (head.run_id,),
        )
    with pytest.raises(LeaseLostError):
        await last.store()
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None]


async def test_a_subgraphs_checkpoint_is_never_held_as_the_last(pool: Pool) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    last = LastCheckpoint()
    last.expect()
    inner = _with_last(step, last)
    inner["configurable"]["checkpoint_ns"] = "delegate:task-1"
    await saver.aput(inner, create_checkpoint(empty_checkpoint(), None, 1), LOOP, {})
    # Stored at once, and the graph's word still stands for its own next checkpoint.
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None, "loop"]
    await saver.aput(
        _with_last(step, last), create_checkpoint(empty_checkpoint(), None, 2), LOOP, {}
    )
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None, "loop"]
    assert last.take() is not None


async def _waiting_on_the_fence(pool: Pool) -> int:
    """How many transactions wait for an advisory lock (the run's fence)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = 7301"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


def _after(config: RunnableConfig, stored: RunnableConfig) -> RunnableConfig:
    """The config of the step after the checkpoint `stored` names."""
    return {**config, "configurable": {**config["configurable"], **stored["configurable"]}}


@dataclasses.dataclass
class _Deferred:
    """A claimed run whose graph deferred a step's checkpoint (held by the saver)."""

    saver: FencedPostgresSaver
    conv: str
    head: RunHead
    last: LastCheckpoint
    base: Checkpoint  # the held checkpoint
    after: RunnableConfig  # the config of the next step, after it


async def _deferred(pool: Pool, hold_s: float = 600.0, *, wrote: bool = False) -> _Deferred:
    """A run's step checkpoint held because the graph deferred it (`wrote`: with a write)."""
    saver = await _saver(pool, hold_s)
    conv, head, step = await _step(pool, saver)
    last = LastCheckpoint()
    base = create_checkpoint(empty_checkpoint(), None, 1)
    if wrote:
        await saver.aput_writes(step, [("context", "built")], "build")
    last.defer()
    held = await saver.aput(_with_last(step, last), base, LOOP, {})
    return _Deferred(saver, conv, head, last, base, _with_last(_after(step, held), last))


async def test_a_deferred_checkpoint_goes_with_the_next_one(pool: Pool) -> None:
    d = await _deferred(pool, wrote=True)
    assert [s for s, _ in await _checkpoints(pool, d.conv)] == [None]  # held, with its writes
    assert await _writes(pool, d.conv) == []

    # The next step's writes and checkpoint go with it, in one transaction, in order.
    await d.saver.aput_writes(d.after, [("messages", ["answer"])], "model")
    await d.saver.aput(d.after, create_checkpoint(d.base, None, 2), LOOP, {})
    checkpoints = await _checkpoints(pool, d.conv)
    assert [s for s, _ in checkpoints] == [None, "loop", "loop"]
    tx = checkpoints[2][1]
    assert checkpoints[1][1] == tx
    assert await _writes(pool, d.conv) == [("build", "context", tx), ("model", "messages", tx)]
    assert d.last.take() is None  # nothing left for the run's end


async def test_a_deferred_checkpoint_whose_successor_does_not_come_is_stored_by_itself(
    pool: Pool,
) -> None:
    d = await _deferred(pool, hold_s=0.05)
    async with asyncio.timeout(60):
        while len(await _checkpoints(pool, d.conv)) < 2:  # noqa: ASYNC110 (rows, no event)
            await asyncio.sleep(0.02)
    assert [s for s, _ in await _checkpoints(pool, d.conv)] == [None, "loop"]
    assert d.last.take() is None


async def test_a_deferred_checkpoint_still_held_goes_with_the_runs_end(pool: Pool) -> None:
    d = await _deferred(pool)
    write = d.last.take()  # the run ended (cancelled, say) during the next step
    assert write is not None
    async with pool.connection() as conn, conn.transaction():
        await write(conn)
        cur = await conn.execute("SELECT (txid_current() % 4294967296)::text AS tx")
        row = await cur.fetchone()
    assert row is not None
    checkpoints = await _checkpoints(pool, d.conv)
    assert [s for s, _ in checkpoints] == [None, "loop"]
    assert checkpoints[-1][1] == row["tx"]  # in the run's end's transaction


async def test_the_graphs_word_that_a_checkpoint_is_its_last_outranks_a_deferral(
    pool: Pool,
) -> None:
    saver = await _saver(pool, hold_s=0.05)
    conv, _, step = await _step(pool, saver)
    other, _, other_step = await _step(pool, saver)
    last = LastCheckpoint()
    last.expect()
    last.defer()  # a node said its step may wait; the router, that it ends the run
    await saver.aput(
        _with_last(step, last), create_checkpoint(empty_checkpoint(), None, 1), LOOP, {}
    )
    deferred = LastCheckpoint()
    deferred.defer()
    await saver.aput(
        _with_last(other_step, deferred), create_checkpoint(empty_checkpoint(), None, 1), LOOP, {}
    )
    # The deferred one, held after it, was stored when its hold ran out; the last one is
    # still held (a hold that ran out before would have handed it to its own write).
    async with asyncio.timeout(60):
        while len(await _checkpoints(pool, other)) < 2:  # noqa: ASYNC110 (rows, no event)
            await asyncio.sleep(0.02)
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None]
    assert last.take() is not None


async def test_a_runs_first_step_checkpoint_waits_with_its_input_for_the_next_one(
    pool: Pool,
) -> None:
    saver = await _saver(pool)
    conv, _, step = await _step(pool, saver)
    last = LastCheckpoint()
    base = create_checkpoint(empty_checkpoint(), None, 1)
    stored = await saver.aput(_with_last(step, last), base, INPUT, {})
    first = _with_last(_after(step, stored), last)
    await saver.aput_writes(first, [("messages", ["go"])], "start")
    held = await saver.aput(first, create_checkpoint(base, None, 2), LOOP, {})
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None]  # input and first held

    await saver.aput(
        _with_last(_after(step, held), last), create_checkpoint(base, None, 3), LOOP, {}
    )
    checkpoints = await _checkpoints(pool, conv)
    assert [s for s, _ in checkpoints] == [None, "input", "loop", "loop"]
    assert len({tx for _, tx in checkpoints[1:]}) == 1  # one transaction


async def test_nothing_is_deferred_with_a_hold_of_zero(pool: Pool) -> None:
    saver = await _saver(pool, hold_s=0)
    conv, _, step = await _step(pool, saver)
    last = LastCheckpoint()
    base = create_checkpoint(empty_checkpoint(), None, 1)
    stored = await saver.aput(_with_last(step, last), base, INPUT, {})
    last.defer()
    await saver.aput(
        _with_last(_after(step, stored), last), create_checkpoint(base, None, 2), LOOP, {}
    )
    checkpoints = await _checkpoints(pool, conv)
    assert [s for s, _ in checkpoints] == [None, "input", "loop"]
    assert checkpoints[1][1] != checkpoints[2][1]


async def test_a_deferred_checkpoint_goes_first_in_the_runs_next_event_append(
    pool: Pool,
) -> None:
    d = await _deferred(pool, wrote=True)
    conv, head, last = d.conv, d.head, d.last
    writer = EventWriter(pool, head, linger_s=600)
    writer.lead = last.lead
    try:
        writer.emit(EventType.SKILL_LOADED, {"name": "a"})  # a step's report, carried
        writer.emit(NOTE)  # not carried: stored now, with the checkpoint ahead of it
        await writer.flush()
    finally:
        await writer.close()
    checkpoints = await _checkpoints(pool, conv)
    assert [s for s, _ in checkpoints] == [None, "loop"]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT DISTINCT xmin::text AS tx FROM run_events WHERE run_id = %s AND seq > 2",
            (head.run_id,),
        )
        events_tx = [r["tx"] for r in await cur.fetchall()]
    assert events_tx == [checkpoints[1][1]]  # one transaction: the checkpoint and the events
    assert await _writes(pool, conv) == [("build", "context", checkpoints[1][1])]
    assert last.lead() is None and last.take() is None  # lent once, nothing left

    # The next checkpoint follows on from it as from any stored one.
    await d.saver.aput(d.after, create_checkpoint(d.base, None, 2), LOOP, {})
    assert [s for s, _ in await _checkpoints(pool, conv)] == [None, "loop", "loop"]


async def test_the_next_checkpoint_waits_for_an_append_its_parent_was_lent_to(
    pool: Pool,
) -> None:
    d = await _deferred(pool)
    lead = d.last.lead()
    assert lead is not None
    put = asyncio.ensure_future(d.saver.aput(d.after, create_checkpoint(d.base, None, 2), LOOP, {}))
    # While the append it was lent to is under way, the next checkpoint is not stored: a
    # crash then must not find a child without its parent (watched for 1 s).
    loop = asyncio.get_running_loop()
    watch_until = loop.time() + 1.0
    while loop.time() < watch_until:
        assert not put.done()
        await asyncio.sleep(0.02)
    async with pool.connection() as conn, conn.transaction():
        await lead.write(conn)
    lead.landed(None)
    await put
    checkpoints = await _checkpoints(pool, d.conv)
    assert [s for s, _ in checkpoints] == [None, "loop", "loop"]
    assert int(checkpoints[1][1]) < int(checkpoints[2][1])  # the parent's transaction first


async def test_the_last_checkpoint_is_never_lent(pool: Pool) -> None:
    saver = await _saver(pool)
    _, _, step = await _step(pool, saver)
    last = LastCheckpoint()
    last.expect()
    await saver.aput(
        _with_last(step, last), create_checkpoint(empty_checkpoint(), None, 1), LOOP, {}
    )
    assert last.lead() is None  # it waits for the run's end
    assert last.take() is not None


async def test_a_checkpoint_lent_to_an_append_that_fails_goes_with_the_next_one(
    pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    d = await _deferred(pool)
    conv, head, last = d.conv, d.head, d.last
    async with pool.connection() as conn:
        await install_faults(conn)
        cur = await conn.execute("SELECT conversation_id FROM runs WHERE id = %s", (head.run_id,))
        found = await cur.fetchone()
        assert found is not None
        armed = str(found["conversation_id"])
        await arm(conn, armed, "events")  # the log refuses its tool events
    # The fault refuses a first attempt's events (the test's claim leaves the run at 0).
    writer = EventWriter(pool, dataclasses.replace(head, attempt=1), linger_s=600)
    writer.lead = last.lead
    try:
        writer.emit(EventType.TOOL_STARTED, {"toolCallId": "c1", "name": "t"})
        writer.emit(NOTE)  # not carried: the append goes now, with the checkpoint lent to it
        async with asyncio.timeout(60):
            while "storing events failed" not in caplog.text:  # noqa: ASYNC110 (a log line)
                await asyncio.sleep(0.02)
        # The append failed and retries; the checkpoint it was lent is held again and goes
        # with the next one, which does not wait for the log.
        await d.saver.aput(d.after, create_checkpoint(d.base, None, 2), LOOP, {})
        checkpoints = await _checkpoints(pool, conv)
        assert [s for s, _ in checkpoints] == [None, "loop", "loop"]
        assert checkpoints[1][1] == checkpoints[2][1]
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM run_events WHERE run_id = %s AND seq > 2",
                (head.run_id,),
            )
            assert (await cur.fetchone()) == {"n": 0}
    finally:
        async with pool.connection() as conn:
            await conn.execute("DELETE FROM test_faults WHERE thread_id = %s", (armed,))
        await writer.flush()  # the log is back: the events go, without a checkpoint
        await writer.close()
    assert [t for _, t, _ in await _log(pool, head.run_id)] == [EventType.TOOL_STARTED, NOTE]


async def test_a_lent_checkpoint_leaves_the_next_steps_writes_for_their_checkpoint(
    pool: Pool,
) -> None:
    d = await _deferred(pool)
    await d.saver.aput_writes(d.after, [("messages", ["answer"])], "model")  # the next step's
    lead = d.last.lead()
    assert lead is not None
    async with pool.connection() as conn, conn.transaction():
        await lead.write(conn)
    lead.landed(None)
    assert [s for s, _ in await _checkpoints(pool, d.conv)] == [None, "loop"]
    assert await _writes(pool, d.conv) == []  # still held for the step's own checkpoint
    stored = await d.saver.aput(d.after, create_checkpoint(d.base, None, 2), LOOP, {})
    tx = await _checkpoint_tx(pool, d.conv, stored["configurable"]["checkpoint_id"])
    assert await _writes(pool, d.conv) == [("model", "messages", tx)]


async def test_the_runs_end_settles_an_append_its_checkpoint_was_lent_to(pool: Pool) -> None:
    d = await _deferred(pool)
    lead = d.last.lead()
    assert lead is not None
    settled = asyncio.ensure_future(d.last.settle())
    await asyncio.sleep(0)
    assert not settled.done()  # the append is under way
    lead.landed(ConnectionError("the append failed"))  # what it was lent is held again
    await settled
    write = d.last.take()  # so the run's end stores it
    assert write is not None
    async with pool.connection() as conn, conn.transaction():
        await write(conn)
    assert [s for s, _ in await _checkpoints(pool, d.conv)] == [None, "loop"]


async def test_an_interrupt_waits_for_an_append_its_checkpoint_was_lent_to(pool: Pool) -> None:
    d = await _deferred(pool)
    lead = d.last.lead()
    assert lead is not None
    interrupt = asyncio.ensure_future(
        d.saver.aput_writes(d.after, [(INTERRUPT, {"value": "approve?"})], "ask")
    )
    await asyncio.sleep(0)
    assert not interrupt.done()  # the append its checkpoint was lent to is under way
    lead.landed(ConnectionError("the append failed"))  # the checkpoint is held again
    await interrupt
    # The interrupt went at once, with the checkpoint it belongs to, in one transaction.
    checkpoints = await _checkpoints(pool, d.conv)
    assert [s for s, _ in checkpoints] == [None, "loop"]
    assert await _writes(pool, d.conv) == [("ask", INTERRUPT, checkpoints[-1][1])]
