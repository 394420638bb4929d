"""A LangGraph stream that finds the log empty, then the run ended, still reads the end.

The stream reads the log after its cursor, and when that read is empty it reads the run's
status. A run that appends its last chunk and `run.completed` between those two reads is
ended by then, with events the stream has not read. The pool here lets the real statements
run and commits that append at exactly that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from graphs.events import EventType
from server.db.pool import Conn, Pool
from server.events.log import NewEvent, RunHead, append_events
from server.events.notify import Notifier
from server.langgraph_api.stream import graph_stream
from tests.support.rows import insert_run

pytestmark = pytest.mark.timeout(120)


class _Interleaved:
    """A connection that runs `before` once, just before the stream reads the run's status."""

    def __init__(self, conn: Conn, before: Callable[[], Awaitable[None]], fired: list[bool]):
        self._conn, self._before, self._fired = conn, before, fired

    async def execute(self, query: Any, params: Any = None) -> Any:
        if str(query).startswith("SELECT status, last_event_seq") and not self._fired:
            self._fired.append(True)
            await self._before()
        return await self._conn.execute(query, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _InterleavingPool:
    def __init__(self, pool: Pool, before: Callable[[], Awaitable[None]]) -> None:
        self._pool, self._before, self._fired = pool, before, []  # type: list[bool]

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[_Interleaved]:
        async with self._pool.connection() as conn:
            yield _Interleaved(conn, self._before, self._fired)


def _chunk(n: int) -> NewEvent:
    return NewEvent(EventType.GRAPH_CHUNK, {"mode": "values", "ns": "", "data": {"n": n}})


async def test_the_last_chunk_committed_between_the_two_reads_is_streamed(
    pool: Pool, database_url: str
) -> None:
    async with pool.connection() as conn:
        run_id = await insert_run(conn)
        head: RunHead
        head, _ = await append_events(
            conn,
            run_id,
            [
                NewEvent(EventType.RUN_CREATED),
                NewEvent(EventType.RUN_STARTED, {"attempt": 1}),
                _chunk(1),
            ],
        )

    async def finish() -> None:
        async with pool.connection() as conn:
            await append_events(
                conn, run_id, [_chunk(2), NewEvent(EventType.RUN_COMPLETED, {})], head=head
            )

    notifier = Notifier(database_url)
    await notifier.start()
    try:
        racing: Any = _InterleavingPool(pool, finish)
        stream = graph_stream(racing, notifier, run_id, after=None, modes=None, heartbeat_s=1.0)
        frames = [f async for f in stream]
    finally:
        await notifier.stop()

    assert racing._fired, "the stream never read the run's status"
    data = [json.loads(f.split("data: ", 1)[1]) for f in frames if "event: values" in f]
    assert data == [{"n": 1}, {"n": 2}]


async def test_a_stream_of_an_expired_log_ends(pool: Pool, database_url: str) -> None:
    # The run ended with more events than the stream can read: the retention dropped them.
    async with pool.connection() as conn:
        run_id = await insert_run(conn)
        await append_events(
            conn,
            run_id,
            [
                NewEvent(EventType.RUN_CREATED),
                NewEvent(EventType.RUN_STARTED, {"attempt": 1}),
                NewEvent(EventType.RUN_COMPLETED, {}),
            ],
        )
        await conn.execute("DELETE FROM run_events WHERE run_id = %s", (run_id,))
        await conn.execute("UPDATE runs SET events_expired_at = now() WHERE id = %s", (run_id,))

    notifier = Notifier(database_url)
    await notifier.start()
    try:
        stream = graph_stream(pool, notifier, run_id, after=None, modes=None, heartbeat_s=1.0)
        frames = await asyncio.wait_for(_all(stream), 30)
    finally:
        await notifier.stop()
    assert [f for f in frames if not f.startswith("event: metadata")] == []


async def _all(stream: AsyncIterator[str]) -> list[str]:
    return [f async for f in stream]
