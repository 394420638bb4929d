"""One LISTEN connection per process, fanned out to in-process waiters.

Notifications say "look again"; a live feed may also take the batch one carries
(server/events/carry.py), but only when it follows on from what the feed holds, so a lost or
coalesced notification delays delivery at worst until the next one or the poll fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import psycopg

from server.events.carry import last_seq, run_of
from server.events.channels import CHANNELS, EVENTS_CHANNEL, RUNS_CHANNEL

log = logging.getLogger(__name__)
UNKNOWN_SEQ = 2**63 - 1  # after a reconnection: anything may have been appended


class RunWake(asyncio.Event):
    """Set whenever the run's log may have grown; `notified` is the highest seq heard of.

    `notified` counts from the start of the watch and is never reset, so a reader that
    cleared the event before reading up to seq N knows whether what woke it since is news.
    """

    def __init__(self) -> None:
        super().__init__()
        self.notified = 0


class Notifier:
    """Listen on our channels and wake whoever waits in this process.

    `channels` defaults to all of them; a process that serves no streams passes
    `WORKER_CHANNELS`, so that it does not receive, parse and dispatch the log's (one per
    event batch). A run watched in such a process is still woken, by its watcher's own poll.
    Postgres before 19 still signals this connection's backend for every notification in the
    database, whatever its channel, and the backend reads the queue in a transaction of its
    own: each listening process costs Postgres that much per notification (docs/decisions/
    1910).
    """

    def __init__(self, url: str, channels: Sequence[str] = CHANNELS) -> None:
        self._url = url
        self._channels = tuple(channels)
        self._run_waiters: dict[str, set[RunWake]] = defaultdict(set)
        self._handlers: dict[str, list[Callable[[str], None]]] = defaultdict(list)
        self._connect_handlers: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        """Connect and start listening; returns once the first LISTEN is in place."""
        self._task = asyncio.create_task(self._listen(), name="notifier")
        await asyncio.wait_for(self.connected.wait(), timeout=30)

    async def stop(self) -> None:
        """Stop listening."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def on(self, channel: str, handler: Callable[[str], None]) -> None:
        """Call `handler(payload)` for every notification on `channel`."""
        self._handlers[channel].append(handler)

    def on_connect(self, handler: Callable[[], None]) -> None:
        """Call `handler()` every time the listener (re)connects: anything may have happened."""
        self._connect_handlers.append(handler)

    @contextlib.contextmanager
    def watch_run(self, run_id: str) -> Any:
        """Yield a `RunWake`, an `asyncio.Event` set whenever the run's log may have grown."""
        event = RunWake()
        self._run_waiters[run_id].add(event)
        try:
            yield event
        finally:
            waiters = self._run_waiters.get(run_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._run_waiters[run_id]

    def wake_all(self) -> None:
        """Wake every stream that watches a run, so that it looks at its state again."""
        self._wake_all()

    def _wake_all(self) -> None:
        for waiters in self._run_waiters.values():
            for event in waiters:
                event.notified = UNKNOWN_SEQ
                event.set()

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == EVENTS_CHANNEL:
            run_id, seq = run_of(payload), last_seq(payload)
            for event in self._run_waiters.get(run_id, ()):
                event.notified = max(event.notified, UNKNOWN_SEQ if seq is None else seq)
                event.set()
        for handler in self._handlers.get(channel, ()):
            try:
                handler(payload)
            except Exception:
                log.exception("notification handler failed on %s", channel)

    async def _notifications(self) -> AsyncIterator[tuple[str, str]]:
        async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
            for channel in self._channels:
                await conn.execute(f"LISTEN {channel}")
            self.connected.set()
            # Anything notified while we were away is unknown: everyone looks again.
            for on_connect in self._connect_handlers:
                on_connect()
            self._wake_all()
            for handler in self._handlers.get(RUNS_CHANNEL, ()):
                handler("reconnected")
            async for notify in conn.notifies():
                yield notify.channel, notify.payload

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                async for channel, payload in self._notifications():
                    delay = 0.1
                    self._dispatch(channel, payload)
            except psycopg.Error as exc:
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
            self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
