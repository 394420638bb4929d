"""The SSE gateway: replay the log after `Last-Event-ID`, then follow it live (SPEC §13-14).

It only reads the event log; closing a stream never touches the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from prometheus_client import Gauge

from server.db import Pool
from server.eventlog import read_events
from server.notify import Notifier
from server.runs import is_terminal

TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled"})


def frame(seq: int, kind: str, payload: str) -> str:
    """Format one SSE frame: `id` is the seq, `event` the type, `data` the event JSON."""
    return f"id: {seq}\nevent: {kind}\ndata: {payload}\n\n"


async def event_stream(
    pool: Pool,
    notifier: Notifier,
    run_id: str,
    after: int,
    *,
    heartbeat_s: float,
    page: int,
    connections: Gauge | None = None,
) -> AsyncIterator[str]:
    """Yield SSE text for every event after `after`, live, until the terminal event."""
    cursor = after
    if connections is not None:
        connections.inc()
    try:
        async for text in _stream(pool, notifier, run_id, cursor, heartbeat_s, page):
            yield text
    finally:
        if connections is not None:
            connections.dec()


async def _stream(
    pool: Pool, notifier: Notifier, run_id: str, cursor: int, heartbeat_s: float, page: int
) -> AsyncIterator[str]:
    with notifier.watch_run(run_id) as wake:
        while True:
            wake.clear()  # before reading, so a notification during the read is not lost
            async with pool.connection() as conn:
                rows = await read_events(conn, run_id, cursor, page)
                if not rows:
                    cur = await conn.execute(
                        "SELECT status, last_event_seq FROM runs WHERE id = %s", (run_id,)
                    )
                    run = await cur.fetchone()
                    if run is None or (
                        is_terminal(run["status"]) and cursor >= run["last_event_seq"]
                    ):
                        return
            if rows:
                chunk = []
                for seq, kind, payload in rows:
                    chunk.append(frame(seq, kind, payload))
                    cursor = seq
                    if kind in TERMINAL_EVENTS:
                        yield "".join(chunk)
                        return
                yield "".join(chunk)
                if len(rows) == page:
                    continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), heartbeat_s)
                continue
            yield ": heartbeat\n\n"
