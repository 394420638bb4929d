"""One transaction on a pipelined connection: two round trips, all or nothing.

`pipelined_transaction` sends `BEGIN` and `COMMIT` as statements, so the block's unread
statements and the `COMMIT` share one sync. Counted here with libpq's protocol trace; every
failure (in the block, or a statement's error met at the sync) leaves nothing stored and the
connection idle, and an append that needs a transaction of its own stays in the block's.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import AsyncCursor, pq
from psycopg.pq import TransactionStatus

from graphs.events import EventType
from server.db.pool import Conn, Pool, pipelined_transaction
from server.errors import LeaseLostError
from server.events.log import NewEvent, StoredEvent, StoreHook, append_events, load_head
from tests.integration.test_eventlog import claim, new_run

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def table(pool: Pool) -> AsyncIterator[str]:
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS pt_rows (id int PRIMARY KEY)")
        await conn.execute("TRUNCATE pt_rows")
    yield "pt_rows"


async def stored(pool: Pool) -> list[int]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM pt_rows ORDER BY id")
        return [r["id"] for r in await cur.fetchall()]


async def traced(conn: Conn, block: Callable[[], Awaitable[None]]) -> list[str]:
    """Run `block` with libpq's protocol trace on; return the messages the client sent."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        with path.open("w") as out:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                await block()
            finally:
                conn.pgconn.untrace()
        lines = path.read_text().splitlines()
    return [line.split("\t")[2] for line in lines if line.startswith("F\t")]


async def test_the_unread_statements_go_with_the_commit_in_one_sync(pool: Pool, table: str) -> None:
    async with pool.connection() as conn:

        async def block() -> None:
            async with pipelined_transaction(conn):
                cur = await conn.execute("SELECT count(*) AS n FROM pt_rows")
                assert (await cur.fetchone()) == {"n": 0}  # read: BEGIN goes with it
                await conn.execute("INSERT INTO pt_rows VALUES (1)")
                await conn.execute("INSERT INTO pt_rows VALUES (2)")

        sent = await traced(conn, block)
        assert conn.info.transaction_status == TransactionStatus.IDLE
    # The read waits on a Flush; the rest, COMMIT included, on the one Sync.
    assert sent.count("Sync") == 1, sent
    assert await stored(pool) == [1, 2]


async def test_psycopgs_own_transaction_in_a_pipeline_took_four_round_trips(
    pool: Pool, table: str
) -> None:
    """What `pipelined_transaction` replaces: a sync at each end of the transaction and of
    its nested pipelines."""
    async with pool.connection() as conn:

        async def block() -> None:
            async with conn.pipeline(), conn.transaction():
                cur = await conn.execute("SELECT count(*) AS n FROM pt_rows")
                await cur.fetchone()
                await conn.execute("INSERT INTO pt_rows VALUES (1)")

        sent = await traced(conn, block)
    assert sent.count("Sync") >= 3, sent


async def test_an_error_in_the_block_stores_nothing(pool: Pool, table: str) -> None:
    async with pool.connection() as conn:
        with pytest.raises(ValueError, match="no"):
            async with pipelined_transaction(conn):
                await conn.execute("INSERT INTO pt_rows VALUES (1)")
                cur = await conn.execute("SELECT 1 AS one")
                await cur.fetchone()  # the insert reached the server
                raise ValueError("no")
        assert conn.info.transaction_status == TransactionStatus.IDLE
        await conn.execute("INSERT INTO pt_rows VALUES (3)")  # the connection still works
    assert await stored(pool) == [3]


async def test_an_unread_statement_failing_at_the_sync_stores_nothing(
    pool: Pool, table: str
) -> None:
    async with pool.connection() as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            async with pipelined_transaction(conn):
                await conn.execute("INSERT INTO pt_rows VALUES (1)")
                await conn.execute("INSERT INTO pt_rows VALUES (1)")  # fails at the sync
                await conn.execute("INSERT INTO pt_rows VALUES (2)")
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert await stored(pool) == []


async def test_refuses_a_connection_already_in_a_transaction_or_a_pipeline(pool: Pool) -> None:
    async with pool.connection() as conn:
        async with conn.transaction():
            with pytest.raises(RuntimeError, match="idle connection"):
                async with pipelined_transaction(conn):
                    pass
        async with conn.pipeline():
            with pytest.raises(RuntimeError, match="idle connection"):
                async with pipelined_transaction(conn):
                    pass


async def test_an_append_with_rows_of_its_own_stays_in_the_blocks_transaction(
    pool: Pool, table: str
) -> None:
    """In a pipeline libpq reports the status of the last sync (idle): an append that opened
    a transaction of its own there would commit the block's halfway."""
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)

    async def extra(conn: Conn, _head: object) -> None:
        await conn.execute("INSERT INTO pt_rows VALUES (7)")

    async with pool.connection() as conn:
        before = await load_head(conn, run_id, lock=False)
        with pytest.raises(ValueError, match="after the append"):
            async with pipelined_transaction(conn):
                await conn.execute("INSERT INTO pt_rows VALUES (6)")
                cur = await conn.execute("SELECT 1 AS one")
                await cur.fetchone()  # nothing pending: libpq says idle
                await append_events(
                    conn,
                    run_id,
                    [NewEvent(EventType.TOOL_STARTED, {"toolCallId": "c1", "name": "t"})],
                    generation=generation,
                    extra=extra,
                )
                raise ValueError("after the append")
        after = await load_head(conn, run_id, lock=False)
    assert after.seq == before.seq
    assert await stored(pool) == []


async def test_an_append_and_its_rows_go_with_the_commit_and_roll_back_if_it_moved_no_head(
    pool: Pool, table: str
) -> None:
    """Nothing of the append is read before the COMMIT; an append behind someone else's
    raises at the sync, and `extra`'s rows are not stored."""
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)

    async def extra(conn: Conn, _head: object) -> None:
        await conn.execute("INSERT INTO pt_rows VALUES (8)")

    note = [NewEvent(EventType.TOOL_STARTED, {"toolCallId": "c1", "name": "t"})]
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)

        async def block() -> None:
            await append_events(conn, run_id, note, generation=generation, head=head, extra=extra)

        sent = await traced(conn, block)
        assert sent.count("Sync") == 1, sent
        assert "Flush" not in sent[: sent.index("Sync")], sent
        assert await stored(pool) == [8]
        assert (await load_head(conn, run_id, lock=False)).seq == head.seq + 1

        # `head` is stale now: the same append is refused at the sync, and stores nothing.
        with pytest.raises(LeaseLostError, match="appended to by someone else"):
            await append_events(conn, run_id, note, generation=generation, head=head, extra=extra)
        assert conn.info.transaction_status == TransactionStatus.IDLE
        assert (await load_head(conn, run_id, lock=False)).seq == head.seq + 1
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM pt_rows")
        # A batch with hooked rows takes the same single round trip, and the same refusal.
        with pytest.raises(LeaseLostError, match="appended to by someone else"):
            await append_events(
                conn, run_id, note, generation=generation, head=head, hooks=[ROWS_HOOK]
            )
    assert await stored(pool) == []


async def _store_rows(cur: AsyncCursor[Any], _run_id: str, events: Sequence[StoredEvent]) -> None:
    await cur.executemany("INSERT INTO pt_rows VALUES (%s)", [(e.seq,) for e in events])


ROWS_HOOK = StoreHook(frozenset({EventType.TOOL_STARTED}), _store_rows)
