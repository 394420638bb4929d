"""The SSE gateway: replay the log after `Last-Event-ID`, then follow it live.

It only reads the event log; closing a stream never touches the run. A stream replays from
the log on its own until it has caught up; from then on it follows the run's `RunFeed`,
which reads each new batch of the log once for every stream of the run in this process
(docs/decisions/0602-shared-live-feed.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from prometheus_client import Gauge

from graphs.events import TERMINAL_EVENTS
from server.db.pool import Pool
from server.domain import is_terminal
from server.events.log import read_events
from server.events.notify import Notifier

Row = tuple[int, str, str]  # (seq, type, SSE frame)


def frame(seq: int, kind: str, payload: str) -> str:
    """Format one SSE frame: `id` is the seq, `event` the type, `data` the event JSON."""
    return f"id: {seq}\nevent: {kind}\ndata: {payload}\n\n"


async def _read(pool: Pool, run_id: str, after: int, page: int) -> tuple[list[Row], bool]:
    """Read up to `page` frames after `after`; when there are none, say if the run is over."""
    async with pool.connection() as conn:
        rows = await read_events(conn, run_id, after, page)
        if rows:
            return [(seq, kind, frame(seq, kind, payload)) for seq, kind, payload in rows], False
        cur = await conn.execute("SELECT status, last_event_seq FROM runs WHERE id = %s", (run_id,))
        run = await cur.fetchone()
    return [], run is None or (is_terminal(run["status"]) and after >= run["last_event_seq"])


class RunFeed:
    """The live tail of one run's log, read once per batch for all of its streams here.

    Keeps the last `keep` frames. A read is shared by every stream that asks while it is in
    flight, but only by those that cleared their wake-up before it started: a stream woken
    by a commit never settles for a read that may predate that commit.
    """

    def __init__(self, pool: Pool, run_id: str, seq: int, keep: int) -> None:
        self._pool = pool
        self.run_id = run_id
        self.base = seq  # frames hold seq base+1 .. seq, contiguous (the log is gapless)
        self.seq = seq
        self.finished = False
        self._frames: list[Row] = []
        self._keep = keep
        self._started = 0  # reads started so far
        self._task: asyncio.Task[None] | None = None
        self._task_no = 0
        self.streams = 0

    @property
    def ticket(self) -> int:
        """Take before reading: `refresh(ticket)` waits for a read started after this."""
        return self._started

    def after(self, cursor: int) -> list[Row] | None:
        """Frames after `cursor` held in memory; None if the feed no longer holds them."""
        if cursor < self.base:
            return None
        return self._frames[cursor - self.base :]

    async def refresh(self, ticket: int, page: int) -> None:
        """Make sure a read of the log started after `ticket` has finished."""
        while True:
            task = self._task
            if task is None:
                self._started += 1
                self._task_no = self._started
                task = self._task = asyncio.create_task(self._read(page))
            if self._task_no > ticket:
                await asyncio.shield(task)
                return
            await asyncio.shield(task)  # started too early: wait for it, then read again

    async def _read(self, page: int) -> None:
        try:
            rows, finished = await _read(self._pool, self.run_id, self.seq, page)
            self._frames.extend(rows)
            if rows:
                self.seq = rows[-1][0]
            self.finished = finished or (bool(rows) and rows[-1][1] in TERMINAL_EVENTS)
            if len(self._frames) > self._keep:
                del self._frames[: len(self._frames) - self._keep // 2]
                self.base = self._frames[0][0] - 1
        finally:
            self._task = None


class Feeds:
    """The live feeds of this process, one per run that has live streams."""

    def __init__(self, pool: Pool, keep: int = 10_000) -> None:
        self._pool = pool
        self._keep = keep
        self._feeds: dict[str, RunFeed] = {}

    @contextlib.contextmanager
    def follow(self, run_id: str, cursor: int) -> Iterator[RunFeed]:
        """Join (or start at `cursor`) the run's feed for as long as the stream lives."""
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = RunFeed(self._pool, run_id, cursor, self._keep)
        feed.streams += 1
        try:
            yield feed
        finally:
            feed.streams -= 1
            if feed.streams == 0 and self._feeds.get(run_id) is feed:
                del self._feeds[run_id]


def _batch(rows: list[Row]) -> tuple[str, int, bool]:
    """Join the frames of `rows`, stopping after a terminal event.

    Returns:
        The SSE text, the seq of its last frame, and whether that frame ends the run.
    """
    for n, (seq, kind, _) in enumerate(rows):
        if kind in TERMINAL_EVENTS:
            return "".join(r[2] for r in rows[: n + 1]), seq, True
    return "".join(r[2] for r in rows), rows[-1][0], False


async def event_stream(
    pool: Pool,
    notifier: Notifier,
    feeds: Feeds,
    run_id: str,
    after: int,
    *,
    heartbeat_s: float,
    page: int,
    connections: Gauge | None = None,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[str]:
    """Yield SSE text for every event after `after`, live, until the terminal event.

    The stream also ends when `stop` is set (the server is shutting down): the client
    reconnects with `Last-Event-ID` and loses nothing.
    """
    cursor = after
    if connections is not None:
        connections.inc()
    try:
        async for text in _stream(pool, notifier, feeds, run_id, cursor, heartbeat_s, page, stop):
            yield text
    finally:
        if connections is not None:
            connections.dec()


@dataclass(frozen=True)
class RunStreams:
    """What a run's SSE stream needs from the process, for every route that streams a run."""

    pool: Pool
    notifier: Notifier
    feeds: Feeds
    heartbeat_s: float
    page: int
    connections: Gauge | None = None
    stop: asyncio.Event | None = None

    def open(self, run_id: str, after: int) -> AsyncIterator[str]:
        """Return the SSE text of the run's events after `after`, live, to its terminal event."""
        return event_stream(
            self.pool,
            self.notifier,
            self.feeds,
            run_id,
            after,
            heartbeat_s=self.heartbeat_s,
            page=self.page,
            connections=self.connections,
            stop=self.stop,
        )


async def _stream(
    pool: Pool,
    notifier: Notifier,
    feeds: Feeds,
    run_id: str,
    cursor: int,
    heartbeat_s: float,
    page: int,
    stop: asyncio.Event | None,
) -> AsyncIterator[str]:
    with notifier.watch_run(run_id) as wake:
        # Replay on our own until caught up, so that a long replay never holds up live streams.
        caught_up = False
        while not caught_up:
            wake.clear()  # before reading, so a notification during the read is not lost
            rows, finished = await _read(pool, run_id, cursor, page)
            caught_up = len(rows) < page
            if finished:
                return
            if rows:
                text, cursor, terminal = _batch(rows)
                yield text
                if terminal:
                    return
        with feeds.follow(run_id, cursor) as feed:
            while stop is None or not stop.is_set():
                held = feed.after(cursor)
                if held is None:  # fell behind what the feed holds: read the log ourselves
                    held, finished = await _read(pool, run_id, cursor, page)
                    if finished:
                        return
                if held:
                    text, cursor, terminal = _batch(held)
                    yield text
                    if terminal:
                        return
                    continue
                if feed.finished and cursor >= feed.seq:
                    return
                try:
                    await asyncio.wait_for(wake.wait(), heartbeat_s)
                except TimeoutError:
                    # Quiet for a while: look at the log anyway, in case a notification was lost.
                    yield ": heartbeat\n\n"
                wake.clear()
                await feed.refresh(feed.ticket, page)
