"""A worker's event writer for one run: group commit of buffered events, fenced by the lease."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from graphs.events import EventType
from server.db.pool import Conn, Pool
from server.errors import LeaseLostError
from server.events.log import NewEvent, RunHead, StoreHook, append_events, load_head
from server.events.store import STATEMENT_MAX

log = logging.getLogger(__name__)


class EventWriter:
    """Buffer a run's events and store them in order, batching whatever piles up meanwhile.

    `emit` never blocks: it appends to the buffer and wakes the flusher. While one batch is
    being written, new events accumulate and go out in the next one (group commit), so token
    deltas cost one transaction per batch, not per token, and a lone event goes out at once.
    Database errors are retried with backoff and lose nothing; a lost lease stops the writer.

    Args:
        pool: The pool.
        head: The run's head right after the claim.
        max_batch: The most events stored in one append.
        on_stored: Called with the number of events of every stored batch.
        hooks: Rows written with the events they derive from (`append_events`).
    """

    def __init__(
        self,
        pool: Pool,
        head: RunHead,
        *,
        max_batch: int = 2000,
        on_stored: Callable[[int], None] | None = None,
        hooks: Sequence[StoreHook] = (),
    ) -> None:
        self._pool = pool
        self._on_stored = on_stored
        self._hooks = tuple(hooks)
        self.head = head
        self._buffer: list[NewEvent] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._max_batch = max_batch
        self.error: BaseException | None = None
        self._task = asyncio.create_task(self._run(), name=f"event-writer-{head.run_id}")

    @property
    def run_id(self) -> str:
        """The run this writer appends to."""
        return self.head.run_id

    def emit(self, kind: EventType, data: Mapping[str, Any] | None = None) -> None:
        """Queue an event; it is stored after every event queued before it."""
        if self.error is not None:
            raise self.error
        self._buffer.append(NewEvent(kind, data or {}))
        self._idle.clear()
        self._wake.set()

    async def flush(self) -> None:
        """Wait until everything queued so far is stored."""
        await self._idle.wait()
        if self.error is not None:
            raise self.error

    async def finish(
        self,
        kind: EventType,
        data: Mapping[str, Any],
        extra: Callable[[Conn, RunHead], Awaitable[None]] | None = None,
        before: Callable[[Conn], Awaitable[None]] | None = None,
    ) -> None:
        """Store everything queued, then `kind` with `before` and `extra` in one transaction."""
        await self.commit([NewEvent(kind, data)], extra, before)

    async def commit(
        self,
        events: list[NewEvent],
        extra: Callable[[Conn, RunHead], Awaitable[None]] | None = None,
        before: Callable[[Conn], Awaitable[None]] | None = None,
    ) -> None:
        """Store everything queued, then `events` with `before` and `extra` in one transaction.

        `before` runs ahead of the append (it needs no head), `extra` after it.
        """
        await self.flush()
        await self._append(events, extra, before)

    async def close(self) -> None:
        """Stop the flusher after storing what is queued (unless the lease was lost)."""
        try:
            if self.error is None:
                await self.flush()
        finally:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _append(
        self,
        batch: list[NewEvent],
        extra: Callable[[Conn, RunHead], Awaitable[None]] | None = None,
        before: Callable[[Conn], Awaitable[None]] | None = None,
    ) -> None:
        delay = 0.05
        while True:
            try:
                with_rows = extra is not None or before is not None
                async with self._pool.connection() as conn, _pipelined(conn, batch, with_rows):
                    self.head, _ = await append_events(
                        conn,
                        self.run_id,
                        batch,
                        generation=self.head.generation,
                        head=self.head,
                        extra=extra,
                        hooks=self._hooks,
                        before=before,
                    )
                if self._on_stored is not None:
                    self._on_stored(len(batch))
                return
            except (psycopg.OperationalError, psycopg.errors.ConnectionTimeout) as exc:
                log.warning("run %s: storing events failed (%s); retrying", self.run_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                # The transaction may or may not have committed: re-read the head to know.
                async with self._pool.connection() as conn:
                    fresh = await load_head(conn, self.run_id, lock=False)
                    if fresh.generation != self.head.generation:
                        raise LeaseLostError(f"run {self.run_id}: lease taken over") from exc
                    if fresh.seq < self.head.seq + len(batch):
                        continue  # not stored: append it again
                    if not await _stored_here(conn, self.head, batch, fresh.seq):
                        # Someone else appended under our lease: never guess, stop the attempt.
                        raise LeaseLostError(f"run {self.run_id}: the log moved") from exc
                self.head = fresh
                return

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._buffer:
                batch = self._buffer[: self._max_batch]
                del self._buffer[: len(batch)]
                try:
                    await self._append(batch)
                except BaseException as exc:
                    self.error = exc
                    self._buffer.clear()
                    self._idle.set()
                    if not isinstance(exc, Exception):
                        raise
                    return
            self._idle.set()


def _pipelined(
    conn: Conn, batch: list[NewEvent], with_rows: bool
) -> AbstractAsyncContextManager[Any]:
    """Pipeline a small batch stored with rows of its own (a run's end with its message).

    It is one transaction; pipelined, the statements whose results nobody reads go out with
    the `COMMIT`. COPY (a large batch) cannot run in a pipeline.
    """
    if not with_rows or len(batch) >= STATEMENT_MAX:  # a plan update may join the batch
        return contextlib.nullcontext()
    return conn.pipeline()


async def _stored_here(conn: Conn, head: RunHead, batch: list[NewEvent], upto: int) -> bool:
    """Say whether the events right after `head` (up to seq `upto`) are `batch` (by type).

    The append of a run's end may have stored a `plan.updated` closing the plan before it
    (server/events/plans.py); that one is not in the batch.
    """
    cur = await conn.execute(
        "SELECT type FROM run_events WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq",
        (head.run_id, head.seq, min(upto, head.seq + len(batch) + 1)),
    )
    found = [r["type"] for r in await cur.fetchall()]
    expected = [e.type for e in batch]
    if EventType.PLAN_UPDATED not in expected:
        found = [t for t in found if t != EventType.PLAN_UPDATED]
    return found[: len(expected)] == expected
