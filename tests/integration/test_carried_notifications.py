"""Live frames carried by the append's notification: byte-identical to a replay, never a gap.

A small batch's notification carries the batch as Postgres stored it, so a process following
the run builds its frames without reading the log; a batch too big for a notification, a gap
or a lost notification sends the feed back to the log. Small batches with store hooks take
the same statement, in one pipelined transaction, and stay fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from graphs.events import EventType
from server.db.pool import Conn, Pool
from server.errors import LeaseLostError
from server.events.carry import carried, last_seq, run_of, stamp
from server.events.channels import EVENTS_CHANNEL
from server.events.log import (
    NewEvent,
    RunHead,
    StoreHook,
    append_events,
    load_head,
    read_events,
)
from server.events.notify import Notifier
from server.events.sse import Feeds, event_stream, frame
from server.runs.conversations import create_conversation
from server.runs.records import NewRun, accept_message
from server.usage.ledger import MODEL_CALLS
from tests.integration.test_eventlog import WHO, claim, new_run
from tests.integration.test_store_hooks import ledger_rows, usage_event

pytestmark = pytest.mark.timeout(120)
HEARTBEAT_S = 120.0  # no heartbeat read while a test runs: the live path alone is measured

# Data whose JSON text differs between Python and Postgres: jsonb reorders keys, spaces them,
# writes numbers its own way and keeps U+2028 and its kin raw.
TRICKY: list[dict[str, Any]] = [
    {
        "text": "héllo 日本語 🎉",
        "seps": "a\u2028b\u2029c\x85d",
        "ctl": "tab\tnl\ncr\r\x01",
        "q": '"quoted" \\ back',
    },
    {"b": 1, "a": {"z": [1, 2, {"y": None}], "aa": True}, "": "empty key", "ab": []},
    {"one": 1.0, "big": 1e20, "small": 1e-7, "neg": -0.0, "huge": 12345678901234567890},
    {},
]


@pytest.fixture
async def notifier(database_url: str) -> AsyncIterator[Notifier]:
    """A listener on every channel, as a process serving streams has (one per test)."""
    listener = Notifier(database_url)
    await listener.start()
    yield listener
    await listener.stop()


@contextlib.contextmanager
def heard(notifier: Notifier, run_id: str, after: int) -> Iterator[list[str]]:
    """Collect the run's payloads on the events channel that announce seq values after `after`.

    Earlier ones (such as the claim's `run.started`) may still be on their way.
    """
    payloads: list[str] = []

    def collect(payload: str) -> None:
        if run_of(payload) == run_id and (last_seq(payload) or 0) > after:
            payloads.append(payload)

    notifier.on(EVENTS_CHANNEL, collect)
    yield payloads


async def until(check: Any, what: str) -> None:
    """Wait until `check()` holds (generous deadline: a loaded two-core machine)."""
    async with asyncio.timeout(60):
        while not check():  # noqa: ASYNC110 (state of other tasks, with no event of its own)
            await asyncio.sleep(0.01)


class Tail:
    """A live SSE stream of a run, read in the background."""

    def __init__(self, pool: Pool, notifier: Notifier, feeds: Feeds, run_id: str, after: int):
        self.text = ""
        stream = event_stream(
            pool, notifier, feeds, run_id, after, heartbeat_s=HEARTBEAT_S, page=1000
        )
        self.task = asyncio.create_task(self._read(stream))

    async def _read(self, stream: AsyncIterator[str]) -> None:
        async for text in stream:
            self.text += text

    async def until(self, seq: int) -> None:
        await until(lambda: f"id: {seq}\n" in self.text or self.task.done(), f"frame {seq}")
        assert f"id: {seq}\n" in self.text


async def replay(pool: Pool, notifier: Notifier, run_id: str, after: int) -> str:
    """The run's frames after `after` as a stream that only reads the log returns them."""
    stream = event_stream(
        pool, notifier, Feeds(pool), run_id, after, heartbeat_s=HEARTBEAT_S, page=1000
    )
    return "".join([text async for text in stream])


async def started(pool: Pool) -> tuple[str, int, RunHead]:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)
    return run_id, generation, head


async def following(pool: Pool, notifier: Notifier, run_id: str, after: int) -> tuple[Tail, Feeds]:
    feeds = Feeds(pool, notifier=notifier)
    tail = Tail(pool, notifier, feeds, run_id, after)
    await until(lambda: feeds.following(run_id) == 1, "the stream follows the run live")
    return tail, feeds


async def test_live_frames_carried_by_notifications_equal_a_replay_byte_for_byte(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    tail, feeds = await following(pool, notifier, run_id, head.seq)
    batches = [
        [NewEvent("note", TRICKY[0])],
        [NewEvent("note", data) for data in TRICKY[1:]],
        [usage_event("mc_carried")],  # a hooked batch: the pipelined transaction
        [NewEvent(EventType.RUN_COMPLETED, {})],
    ]
    with heard(notifier, run_id, start) as payloads:
        for batch in batches:
            async with pool.connection() as conn:
                head, _ = await append_events(
                    conn, run_id, batch, generation=generation, head=head, hooks=[MODEL_CALLS]
                )
            await tail.until(head.seq)
        await asyncio.wait_for(tail.task, 60)

    assert all(carried(p) is not None for p in payloads)
    assert (feeds.carried, feeds.reads) == (len(batches), 0)
    live = tail.text
    assert live == await replay(pool, notifier, run_id, start)
    assert "héllo 日本語 🎉" in live and "\u2028" in live and '"big": 100000000000000000000' in live
    assert [r["id"] for r in await ledger_rows(pool, run_id)] == ["mc_carried"]


def _note_of_payload_size(run_id: str, seq: int, size: int) -> NewEvent:
    """A `note` whose carrying payload would be exactly `size` bytes (ASCII, one event)."""
    ts = stamp(datetime.now(UTC))
    fixed = f'{run_id}:{seq}\n{ts}\n{seq} note {{"t": ""}}'
    return NewEvent("note", {"t": "x" * (size - len(fixed))})


async def test_a_batch_too_big_for_a_notification_is_stored_and_read_from_the_log(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    tail, feeds = await following(pool, notifier, run_id, head.seq)
    first = head.seq
    with heard(notifier, run_id, first) as payloads:
        # Postgres refuses payloads of 8000 bytes or more (by default): the cut is below.
        for size in (7999, 8000, 100_000):
            event = _note_of_payload_size(run_id, head.seq + 1, size)
            async with pool.connection() as conn:
                head, _ = await append_events(
                    conn, run_id, [event], generation=generation, head=head
                )
            await tail.until(head.seq)
        burst = [NewEvent("note", {"n": n}) for n in range(100)]  # stored by COPY
        async with pool.connection() as conn:
            head, _ = await append_events(conn, run_id, burst, generation=generation, head=head)
        await tail.until(head.seq)
        async with pool.connection() as conn:
            head, _ = await append_events(
                conn,
                run_id,
                [NewEvent(EventType.RUN_COMPLETED, {})],
                generation=generation,
                head=head,
            )
        await asyncio.wait_for(tail.task, 60)

    kinds = ["carried" if carried(p) else "pointer" for p in payloads]
    assert kinds == ["carried", "pointer", "pointer", "pointer", "carried"]
    assert len(payloads[0].encode()) == 7999
    assert payloads[1:4] == [
        f"{run_id}:{first + 2}",
        f"{run_id}:{first + 3}",
        f"{run_id}:{head.seq - 1}",
    ]
    assert feeds.reads == 3
    assert tail.text == await replay(pool, notifier, run_id, first)


async def test_a_feed_reads_the_log_when_a_carried_batch_does_not_follow_on(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    behind = head.seq
    with heard(notifier, run_id, behind) as payloads:
        async with pool.connection() as conn:
            # Committed and heard before the feed exists: it never sees them.
            head, _ = await append_events(
                conn,
                run_id,
                [NewEvent("note", {"k": k}) for k in range(3)],
                generation=generation,
                head=head,
            )
        await until(lambda: len(payloads) == 1, "the notification of the first batch")
    feeds = Feeds(pool, notifier=notifier)
    with feeds.follow(run_id, behind) as feed, notifier.watch_run(run_id) as wake:
        async with pool.connection() as conn:
            head, _ = await append_events(
                conn, run_id, [NewEvent("note", {"k": 3})], generation=generation, head=head
            )
        await asyncio.wait_for(wake.wait(), 60)
        assert feed.after(behind) == []  # a gap: not taken
        await feed.refresh(feed.demand, 1000)
        assert [seq for seq, _, _ in feed.after(behind) or []] == list(
            range(behind + 1, head.seq + 1)
        )
        assert (feed.reads, feeds.carried) == (1, 0)

        wake.clear()
        async with pool.connection() as conn:
            head, _ = await append_events(
                conn,
                run_id,
                [NewEvent(EventType.RUN_COMPLETED, {})],
                generation=generation,
                head=head,
            )
        await asyncio.wait_for(wake.wait(), 60)
        await feed.refresh(feed.demand, 1000)  # no read owed: returns at once
        assert (feed.reads, feeds.carried, feed.finished) == (1, 1, True)
        held = "".join(text for _, _, text in feed.after(behind) or [])
    assert held == await replay(pool, notifier, run_id, behind)


async def append_usage(
    conn: Conn, run_id: str, call_id: str, generation: int, head: RunHead
) -> RunHead:
    """Append one `usage` event with its model-call row, as a worker's writer does."""
    new, _ = await append_events(
        conn, run_id, [usage_event(call_id)], generation=generation, head=head, hooks=[MODEL_CALLS]
    )
    return new


async def test_a_hooked_batch_on_a_stale_head_or_lease_stores_nothing(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, old, stale = await started(pool)
    with heard(notifier, run_id, stale.seq) as payloads:
        async with pool.connection() as conn:
            # Someone else appends: the head we hold is stale.
            head, _ = await append_events(
                conn, run_id, [NewEvent("note")], generation=old, head=stale
            )
            with pytest.raises(LeaseLostError):
                await append_usage(conn, run_id, "mc_stale_head", old, stale)
            assert conn.info.transaction_status == TransactionStatus.IDLE
            for _ in range(3):  # the connection's prepared statements are still in order
                assert (await load_head(conn, run_id, lock=False)).seq == head.seq
        new = await claim(pool, run_id)  # another worker takes the lease over
        async with pool.connection() as conn:
            head = await load_head(conn, run_id, lock=False)
            with pytest.raises(LeaseLostError):
                await append_usage(conn, run_id, "mc_stale_lease", old, head)
            assert conn.info.transaction_status == TransactionStatus.IDLE
            # The new owner's append goes through, on the same connection.
            head = await append_usage(conn, run_id, "mc_owner", new, head)
        # Notifications arrive in commit order: once the owner's is heard, no other is coming.
        await until(lambda: any(p.startswith(f"{run_id}:{head.seq}\n") for p in payloads), "owner")

    assert [r["id"] for r in await ledger_rows(pool, run_id)] == ["mc_owner"]
    stored = await replay_kinds(pool, run_id)
    assert stored.count("usage") == 1 and stored[-1] == "usage"
    assert sum("mc_stale" in p for p in payloads) == 0
    assert [last_seq(p) for p in payloads] == [
        stale.seq + 1,
        head.seq - 1,
        head.seq,
    ]


async def replay_kinds(pool: Pool, run_id: str) -> list[str]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,)
        )
        return [r["type"] for r in await cur.fetchall()]


async def test_an_append_that_locks_the_run_stores_hook_rows_in_its_transaction(
    pool: Pool,
) -> None:
    run_id, generation, _ = await started(pool)
    async with pool.connection() as conn:
        # No cached head (the memory jobs' way): the run's row is locked and read first.
        head, _ = await append_events(
            conn, run_id, [usage_event("mc_locked")], generation=generation, hooks=[MODEL_CALLS]
        )
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert await ledger_rows(pool, run_id) == [
        {"id": "mc_locked", "event_seq": head.seq, "total_tokens": 7}
    ]


async def test_a_batch_notified_while_the_listener_was_away_is_read_from_the_log(
    pool: Pool, database_url: str, pg_admin_url: str
) -> None:
    listener = Notifier(database_url)
    await listener.start()
    try:
        run_id, generation, head = await started(pool)
        tail, feeds = await following(pool, listener, run_id, head.seq)
        async with (
            pool.connection() as conn,
            await psycopg.AsyncConnection.connect(pg_admin_url, autocommit=True) as admin,
        ):
            # Keep the listener away (no new connection to this database), then cut it off.
            name = (await (await conn.execute("SELECT current_database() AS n")).fetchone())["n"]
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            try:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
                )
                await until(lambda: not listener.connected.is_set(), "the listener is away")
                head, _ = await append_events(
                    conn,
                    run_id,
                    [NewEvent(EventType.RUN_COMPLETED, {})],
                    generation=generation,
                    head=head,
                )  # committed, so notified, while nobody listened
                assert not listener.connected.is_set()
            finally:
                await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await asyncio.wait_for(tail.task, 60)
    finally:
        await listener.stop()
    assert f"id: {head.seq}\nevent: run.completed\n" in tail.text
    assert (feeds.reads, feeds.carried) == (1, 0)


async def test_a_hook_whose_statement_fails_stores_nothing_and_leaves_the_connection_clean(
    pool: Pool,
) -> None:
    run_id, generation, head = await started(pool)

    async def bad_sql(cur: Any, run: str, events: Any) -> None:
        await cur.execute("INSERT INTO model_calls (id) VALUES (NULL)")  # violates NOT NULL

    broken = StoreHook(frozenset({EventType.USAGE}), bad_sql)
    async with pool.connection() as conn:
        with pytest.raises(psycopg.errors.NotNullViolation):
            await append_events(
                conn,
                run_id,
                [usage_event("mc_bad")],
                generation=generation,
                head=head,
                hooks=[broken],
            )
        assert conn.info.transaction_status == TransactionStatus.IDLE
        assert (await load_head(conn, run_id, lock=False)).seq == head.seq
        # The same head still appends: nothing of the failed batch was kept.
        head, _ = await append_events(
            conn,
            run_id,
            [usage_event("mc_good")],
            generation=generation,
            head=head,
            hooks=[MODEL_CALLS],
        )
    assert [r["id"] for r in await ledger_rows(pool, run_id)] == ["mc_good"]


async def test_a_stream_of_a_run_just_created_starts_from_its_notification_without_a_read(
    pool: Pool, notifier: Notifier
) -> None:
    feeds = Feeds(pool, notifier=notifier)  # listening before the run exists, as an API's
    runs: list[str] = []
    notifier.on(EVENTS_CHANNEL, lambda p: runs.append(run_of(p)))
    run_id = await new_run(pool)
    await until(lambda: run_id in runs, "the notification of run.created")
    tail = Tail(pool, notifier, feeds, run_id, 0)
    await tail.until(1)
    generation = await claim(pool, run_id)
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)
        await append_events(
            conn, run_id, [NewEvent(EventType.RUN_COMPLETED, {})], generation=generation, head=head
        )
    await asyncio.wait_for(tail.task, 60)

    assert tail.text.startswith("id: 1\nevent: run.created\n")
    assert tail.text == await replay(pool, notifier, run_id, 0)
    assert (feeds.stream_reads, feeds.reads, feeds.carried) == (0, 0, 2)


async def test_a_stream_starts_with_the_batch_its_creator_committed(
    pool: Pool, notifier: Notifier
) -> None:
    """The POST that streams its new run sends `run.created` as the request stored it: no
    read of the log, and no wait for the notification, which may not have arrived yet."""
    conv = await create_conversation(pool, WHO, None, None, {})

    async def build(_conn: Conn, _conversation: dict[str, Any]) -> NewRun:
        return NewRun(conv["id"], "hello", "demo", {})

    accepted = await accept_message(pool, WHO, conv["id"], build)
    run_id = accepted.answer["runId"]
    async with pool.connection() as conn:
        expected = "".join(frame(*row) for row in await read_events(conn, run_id, 0, 10))

    async def first_text(committed: str | None) -> tuple[str, int]:
        feeds = Feeds(pool)  # takes no notification: a read, or the committed batch
        stream = event_stream(
            pool,
            notifier,
            feeds,
            run_id,
            0,
            heartbeat_s=HEARTBEAT_S,
            page=1000,
            committed=committed,
        )
        text = await anext(stream)
        await stream.aclose()
        return text, feeds.stream_reads

    assert await first_text(accepted.created) == (expected, 0)
    assert await first_text(None) == (expected, 1)
