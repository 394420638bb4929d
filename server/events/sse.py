"""The SSE gateway: replay the log after `Last-Event-ID`, then follow it live.

It only reads the event log; closing a stream never touches the run. A stream replays from
the log on its own until it has caught up; from then on it follows the run's `RunFeed`,
which holds each new batch once for every stream of the run in this process
(docs/decisions/0602-shared-live-feed.md): the batch the append's notification carries when
it follows on from what the feed holds, otherwise a read of the log
(docs/decisions/1960-notifications-carry-small-batches.md).
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
from server.events.carry import RecentBatches, carried, run_of
from server.events.channels import EVENTS_CHANNEL
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
    """The live tail of one run's log, held once per batch for all of its streams here.

    Keeps the last `keep` frames. A batch carried by its notification is taken as is when it
    follows on from the last frame held (`offer`); any other news of the log (a pointer, a gap,
    a reconnection of the listener) asks for a read (`demand`). A read is shared by every
    stream that asks while it is in flight, but only by those that asked before it started:
    a stream woken by a commit never settles for a read that may predate that commit.
    """

    def __init__(
        self, pool: Pool, run_id: str, seq: int, keep: int, seed: list[Row] | None = None
    ) -> None:
        self._pool = pool
        self.reads = 0  # reads of the log that returned frames
        self.run_id = run_id
        self.base = seq  # frames hold seq base+1 .. seq, contiguous (the log is gapless)
        self.seq = seq
        self.finished = False
        self._frames: list[Row] = []
        self._keep = keep
        self._extend(seed or [])
        self._started = 0  # reads started so far
        self._done = 0  # the number of the last read finished (one read at a time)
        self.demand = -1  # news the feed holds no frames for: a read numbered above is owed
        self._task: asyncio.Task[None] | None = None
        self._task_no = 0
        self.streams = 0

    def after(self, cursor: int) -> list[Row] | None:
        """Frames after `cursor` held in memory; None if the feed no longer holds them."""
        if cursor < self.base:
            return None
        return self._frames[cursor - self.base :]

    def want_read(self) -> None:
        """Owe a read of the log that starts after now (the log may hold more than the feed)."""
        self.demand = self._started

    def offer(self, seq: int, rows: list[Row]) -> bool:
        """Take the frames of a batch carried by its notification, ending at seq `seq`.

        Returns whether the feed took frames from the batch.

        Notifications of one run arrive in commit order, because appends to a run are
        serialised by the conditional update of its row; the feed relies on that only through
        this check that the batch follows on from what it holds.
        """
        first = seq - len(rows) + 1
        if seq <= self.seq:
            return False  # already held (a read got there first)
        if first > self.seq + 1:
            self.want_read()  # a gap: a notification was lost, or came before this feed
            return False
        self._extend(rows[self.seq + 1 - first :])
        return True

    def _extend(self, rows: list[Row]) -> None:
        """Append frames that start right after the last one held."""
        self._frames.extend(rows)
        if rows:
            self.seq = rows[-1][0]
            self.finished = self.finished or rows[-1][1] in TERMINAL_EVENTS
        if len(self._frames) > self._keep:
            del self._frames[: len(self._frames) - self._keep // 2]
            self.base = self._frames[0][0] - 1

    async def refresh(self, ticket: int, page: int) -> None:
        """Make sure a read of the log numbered above `ticket` (`demand`) has finished."""
        if self._done > ticket:
            return
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
        number = self._task_no
        try:
            rows, finished = await _read(self._pool, self.run_id, self.seq, page)
            # Carried batches may have been taken during the read: keep only what follows them.
            self._extend([r for r in rows if r[0] > self.seq])
            self.reads += bool(rows)
            self.finished = self.finished or finished
            self._done = number
        finally:
            self._task = None


class Feeds:
    """The live feeds of this process, one per run that has live streams.

    With a `notifier`, the feeds take the batches its notifications carry; without one, every
    live batch is read from the log. `reads` counts the feeds' reads of the log that returned
    frames, `carried` the batches taken from notifications, `stream_reads` the reads streams
    made on their own (replay, or behind what their feed holds).
    """

    def __init__(self, pool: Pool, keep: int = 10_000, notifier: Notifier | None = None) -> None:
        self._pool = pool
        self._keep = keep
        self._feeds: dict[str, RunFeed] = {}
        self._ended_reads = 0
        self.carried = 0
        self.stream_reads = 0
        self._recent = RecentBatches()
        if notifier is not None:
            notifier.on(EVENTS_CHANNEL, self._notified)
            notifier.on_connect(self._reconnected)

    def _notified(self, payload: str) -> None:
        run_id = run_of(payload)
        self._recent.add(run_id, payload)
        feed = self._feeds.get(run_id)
        if feed is None:
            return
        batch = carried(payload)
        if batch is None:
            feed.want_read()
            return
        self.carried += feed.offer(batch.last, _framed(batch.events))

    @property
    def reads(self) -> int:
        """The feeds' reads of the log that returned frames, so far."""
        return self._ended_reads + sum(feed.reads for feed in self._feeds.values())

    def following(self, run_id: str) -> int:
        """Return how many streams of this process follow the run live."""
        feed = self._feeds.get(run_id)
        return 0 if feed is None else feed.streams

    def _reconnected(self) -> None:
        # What was notified while the listener was away is unknown: every feed reads the log.
        self._recent.clear()
        for feed in self._feeds.values():
            feed.want_read()

    def recent(self, run_id: str, cursor: int) -> list[Row] | None:
        """Frames after `cursor` if the run has no feed and its latest notifications hold all.

        A stream that starts with them must start following the run before it next awaits,
        so that no notification falls between the two (`RecentBatches`).
        """
        if run_id in self._feeds:
            return None
        events = self._recent.after(run_id, cursor)
        if events is None:
            return None
        return _framed(events)

    @contextlib.contextmanager
    def follow(self, run_id: str, cursor: int, seed: list[Row] | None = None) -> Iterator[RunFeed]:
        """Join (or start at `cursor`, holding `seed`) the run's feed while the stream lives."""
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = RunFeed(self._pool, run_id, cursor, self._keep, seed)
        feed.streams += 1
        try:
            yield feed
        finally:
            feed.streams -= 1
            if feed.streams == 0 and self._feeds.get(run_id) is feed:
                del self._feeds[run_id]
                self._ended_reads += feed.reads


def _framed(events: list[tuple[int, str, str]]) -> list[Row]:
    """Frame events given as (seq, type, wire JSON)."""
    return [(seq, kind, frame(seq, kind, wire)) for seq, kind, wire in events]


def _rows_after(payload: str, cursor: int) -> list[Row] | None:
    """Frames after `cursor` of the batch `payload` carries, if it holds all from `cursor + 1`."""
    batch = carried(payload)
    if batch is None or batch.first > cursor + 1 or batch.last <= cursor:
        return None
    return _framed([e for e in batch.events if e[0] > cursor])


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
    committed: str | None = None,
) -> AsyncIterator[str]:
    """Yield SSE text for every event after `after`, live, until the terminal event.

    The stream also ends when `stop` is set (the server is shutting down): the client
    reconnects with `Last-Event-ID` and loses nothing. `committed`: see `RunStreams.open`.
    """
    cursor = after
    if connections is not None:
        connections.inc()
    try:
        async for text in _stream(
            pool, notifier, feeds, run_id, cursor, heartbeat_s, page, stop, committed
        ):
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

    def open(self, run_id: str, after: int, committed: str | None = None) -> AsyncIterator[str]:
        """Return the SSE text of the run's events after `after`, live, to its terminal event.

        `committed` is a batch of the run's committed events as a notification carries them
        (server/events/carry.py), such as the request that created the run stored: the
        stream may start with it, not waiting for its notification or reading the log.
        """
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
            committed=committed,
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
    committed: str | None,
) -> AsyncIterator[str]:
    with notifier.watch_run(run_id) as wake:
        # The run's latest notifications may hold all we need (a run just posted): no read.
        # Failing those, the batch the caller committed: its notification, and any after it,
        # have not arrived yet (they arrive in commit order), so the feed will hear of them.
        recent = feeds.recent(run_id, cursor)
        if recent is None and committed is not None:
            recent = _rows_after(committed, cursor)
        # Replay on our own until caught up, so that a long replay never holds up live streams.
        caught_up = recent is not None
        while not caught_up:
            wake.clear()  # before reading, so a notification during the read is not lost
            feeds.stream_reads += 1
            rows, finished = await _read(pool, run_id, cursor, page)
            caught_up = len(rows) < page
            if finished:
                return
            if rows:
                text, cursor, terminal = _batch(rows)
                yield text
                if terminal:
                    return
        with feeds.follow(run_id, cursor, recent) as feed:
            if wake.notified > cursor:  # heard of, maybe before the feed existed, and not read
                feed.want_read()
            while stop is None or not stop.is_set():
                held = feed.after(cursor)
                if held is None:  # fell behind what the feed holds: read the log ourselves
                    feeds.stream_reads += 1
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
                    feed.want_read()
                wake.clear()
                # At once if the feed took the batch the notification carried.
                await feed.refresh(feed.demand, page)
