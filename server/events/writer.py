"""A worker's event writer for one run: group commit of buffered events, fenced by the lease."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from graphs.events import EventType
from server.db.checkpoint import Landing, Lead
from server.db.pool import Conn, Pool
from server.errors import LeaseLostError, RunFinishedError
from server.events.log import (
    NewEvent,
    RunHead,
    StoreHook,
    append_events,
    fold_events,
    load_head,
)
from server.events.store import STATEMENT_MAX
from server.settings import Settings

log = logging.getLogger(__name__)

# The installation's default (`AGENTRT_EVENT_LINGER_S`); the executor passes the setting.
EVENT_LINGER_S: float = Settings.model_fields["event_linger_s"].default


# Events that report what a step did rather than what is under way, and the start of a tool
# call, whose end follows within moments unless the tool is slow: a client loses nothing when
# they reach it a moment later. They wait for a checkpoint write of the run to carry them
# (`board`), for the next event of another type, or for the writer's linger time (so a slow
# tool's start is stored `linger_s` after it, and a fast one's with its end).
CARRIED = frozenset(
    {
        EventType.TOOL_STARTED,
        EventType.CONTEXT_BUILT,
        EventType.USAGE,
        EventType.MESSAGE_ITEM_COMPLETED,
        EventType.TOOL_COMPLETED,
        EventType.TOOL_FAILED,
        EventType.RETRIEVAL_COMPLETED,
        EventType.SKILL_LOADED,
    }
)
# Pieces of a stream (an answer's text, a LangGraph stream part): each batch of them rewrites
# the run's snapshot, whose text grows with the answer, so they are stored at most every
# `pace_s`, together; the first goes at once, with the event that opened its item.
PACED = frozenset({EventType.MESSAGE_ITEM_DELTA, EventType.GRAPH_CHUNK})


class EventWriter:
    """Buffer a run's events and store them in order, batching whatever piles up meanwhile.

    `emit` never blocks: it appends to the buffer and wakes the flusher. While one batch is
    being written, new events accumulate and go out in the next one (group commit), so token
    deltas cost one transaction per batch, not per token, and a lone event goes out at once.
    Events of the `CARRIED` types wait up to `linger_s` for a checkpoint write of the run to
    take them into its transaction (the writer is the saver's `Rider`), so a step's reports
    cost no commit of their own; events of the `PACED` types go out at most every `pace_s`.
    Database errors are retried with backoff and lose nothing; a
    lost lease stops the writer.

    Args:
        pool: The pool.
        head: The run's head right after the claim.
        max_batch: The most events stored in one append.
        on_stored: Called with the number of events of every stored batch.
        hooks: Rows written with the events they derive from (`append_events`).
        linger_s: The longest a `CARRIED` event waits for a checkpoint write.
        pace_s: The shortest time between two batches sent for `PACED` events.
    """

    def __init__(
        self,
        pool: Pool,
        head: RunHead,
        *,
        max_batch: int = 2000,
        on_stored: Callable[[int], None] | None = None,
        hooks: Sequence[StoreHook] = (),
        linger_s: float = EVENT_LINGER_S,
        pace_s: float = 0.025,
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
        self._linger_s = linger_s
        self._pace_s = pace_s
        self._sent_at = float("-inf")  # when the last batch was taken to be stored (loop time)
        self._due = False  # the buffer must go out now, not wait for a checkpoint write
        self._timer: asyncio.TimerHandle | None = None
        # Held by whoever is storing a batch: the flusher, `commit`, or a checkpoint write.
        self._turn = asyncio.Lock()
        # A batch whose transaction failed in a way that may still have committed it; it is
        # back at the head of the buffer until the log says whether it was stored.
        self._doubt: tuple[RunHead, list[NewEvent]] | None = None
        self.error: BaseException | None = None
        # Lends the run's deferred checkpoints to the flusher's appends, which store them first
        # (`LastCheckpoint.lead`): no event of a deferred step goes ahead of its checkpoint.
        self.lead: Callable[[], Lead | None] | None = None
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
        if self._due:
            self._wake.set()
        elif kind in CARRIED:
            self._hurry_in(self._linger_s)
        elif kind in PACED:
            self._hurry_in(self._sent_at + self._pace_s - asyncio.get_running_loop().time())
        else:
            self._hurry()

    async def flush(self) -> None:
        """Wait until everything queued so far is stored."""
        if not self._idle.is_set():
            self._hurry()
        await self._idle.wait()
        if self.error is not None:
            raise self.error

    async def folded(self) -> RunHead:
        """Return the head as it will be once everything queued so far is stored."""
        async with self._turn:
            if self.error is not None:
                raise self.error
            await self._settle()
            head, _ = fold_events(self.head, self._buffer, datetime.now(UTC))
            return head

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

        `before` runs ahead of the append (it needs no head), `extra` after it. A few queued
        events go in that same transaction; many are stored first.
        """
        if len(self._buffer) + len(events) >= STATEMENT_MAX:
            await self.flush()
        async with self._turn:
            if self.error is not None:
                raise self.error
            await self._settle()
            queued = self._take(len(self._buffer))
            try:
                await self._append(queued + events, extra, before, led=True)
            except (LeaseLostError, RunFinishedError) as exc:
                # What was queued cannot be stored either: the writer is done.
                self.error = exc
                self._idle.set()
                raise
            except BaseException:
                self._buffer[:0] = queued  # the flusher stores them; the caller decides the rest
                self._hurry()
                raise
        self._idle_if_empty()  # only with the turn released: a `flush` may be waiting

    async def close(self) -> None:
        """Stop the flusher after storing what is queued (unless the lease was lost)."""
        try:
            if self.error is None:
                await self.flush()
        finally:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._cancel_timer()

    async def board(self, conn: Conn) -> Landing | None:
        """Append what is queued in the caller's transaction: a checkpoint write of the run.

        Return what to call once that transaction has ended, or None if nothing was appended
        (nothing queued, another batch in flight, or a batch too large for a pipeline).
        """
        if self._turn.locked() or not self._may_board():
            return None
        await self._turn.acquire()  # free: taken at once, unless a waiter was just woken
        if not self._may_board():
            self._turn.release()
            self._idle_if_empty()
            return None
        head, batch = self.head, self._take(len(self._buffer))
        try:
            new_head, _ = await append_events(
                conn,
                self.run_id,
                batch,
                generation=head.generation,
                head=head,
                hooks=self._hooks,
            )
        except (psycopg.Error, asyncio.CancelledError):
            self._land(head, batch, None, failed=True)
            raise
        except Exception:
            # Refused before anything was sent (the run ended, a lease moved on): the writer's
            # own append meets the same refusal and stops the attempt.
            self._land(head, batch, None, failed=False)
            return None

        def land(exc: BaseException | None) -> None:
            self._land(head, batch, new_head if exc is None else None, failed=exc is not None)

        return land

    def _may_board(self) -> bool:
        queued = len(self._buffer)
        return self.error is None and self._doubt is None and 0 < queued < STATEMENT_MAX

    def _land(
        self, head: RunHead, batch: list[NewEvent], stored: RunHead | None, *, failed: bool
    ) -> None:
        """End a boarding: keep its head if stored, else put its batch back, maybe in doubt."""
        try:
            if stored is not None:
                self.head = stored
                if self._on_stored is not None:
                    self._on_stored(len(batch))
                return
            self._buffer[:0] = batch
            if failed:
                self._doubt = (head, batch)
            self._hurry()
        finally:
            self._turn.release()
            self._idle_if_empty()

    def _hurry(self) -> None:
        """Have the flusher store the buffer now."""
        self._due = True
        self._wake.set()

    def _hurry_in(self, delay: float) -> None:
        """Have the flusher store the buffer in `delay` seconds at the latest."""
        if delay <= 0:
            self._hurry()
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = loop.call_at(when, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._hurry()

    def _take(self, count: int) -> list[NewEvent]:
        """Take the first `count` events of the buffer, pieces of text joined (`joined`).

        A buffer left empty owes nothing.
        """
        self._sent_at = asyncio.get_running_loop().time()
        batch = joined(self._buffer[:count])
        del self._buffer[:count]
        if not self._buffer:
            self._due = False
            self._cancel_timer()
        return batch

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle_if_empty(self) -> None:
        if not self._buffer and not self._turn.locked():
            self._idle.set()

    async def _settle(self) -> None:
        """Learn whether the batch in doubt was stored; drop it from the buffer if it was."""
        while self._doubt is not None:
            head, batch = self._doubt
            try:
                stored = await self._stored(head, batch)
            except (psycopg.OperationalError, psycopg.errors.ConnectionTimeout) as exc:
                log.warning("run %s: reading the log failed (%s); retrying", self.run_id, exc)
                await asyncio.sleep(0.2)
                continue
            self._doubt = None
            if stored is not None:
                del self._buffer[: len(batch)]
                self.head = stored
                if self._on_stored is not None:
                    self._on_stored(len(batch))

    async def _stored(self, head: RunHead, batch: list[NewEvent]) -> RunHead | None:
        """Return the run's head if `batch` was appended after `head`, None if it was not."""
        async with self._pool.connection() as conn:
            fresh = await load_head(conn, self.run_id, lock=False)
            if fresh.generation != head.generation:
                raise LeaseLostError(f"run {self.run_id}: lease taken over")
            if fresh.seq < head.seq + len(batch):
                return None
            if not await _stored_here(conn, head, batch, fresh.seq):
                # Someone else appended under our lease: never guess, stop the attempt.
                raise LeaseLostError(f"run {self.run_id}: the log moved")
        return fresh

    async def _append(
        self,
        batch: list[NewEvent],
        extra: Callable[[Conn, RunHead], Awaitable[None]] | None = None,
        before: Callable[[Conn], Awaitable[None]] | None = None,
        *,
        led: bool = False,
    ) -> None:
        """Append `batch` (with `before` and `extra`), retrying until the log has it.

        `led`: the run's deferred checkpoints, if any are held (`lead`), go first in the
        transaction. Should it fail, they are given back to the saver, which stores them with
        the next checkpoint as if never lent, and the retries go without them: a log that
        refuses events holds no checkpoint back.
        """
        lead = self.lead() if led and self.lead is not None else None
        delay = 0.05
        try:
            while True:
                try:
                    async with self._pool.connection() as conn:
                        self.head, _ = await append_events(
                            conn,
                            self.run_id,
                            batch,
                            generation=self.head.generation,
                            head=self.head,
                            extra=extra,
                            hooks=self._hooks,
                            before=before if lead is None else in_order(lead.write, before),
                        )
                    if lead is not None:
                        landed = lead.landed
                        lead = None
                        landed(None)
                    if self._on_stored is not None:
                        self._on_stored(len(batch))
                    return
                except (psycopg.OperationalError, psycopg.errors.ConnectionTimeout) as exc:
                    log.warning("run %s: storing events failed (%s); retrying", self.run_id, exc)
                    if lead is not None:
                        # Given back at once, whether or not the transaction committed (a
                        # checkpoint's rows may be stored twice): the retries go without it.
                        landed = lead.landed
                        lead = None
                        landed(exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    # The transaction may or may not have committed: read the log to know.
                    stored = await self._stored(self.head, batch)
                    if stored is not None:
                        self.head = stored
                        return
        except BaseException as exc:
            if lead is not None:
                lead.landed(exc)
            raise

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._buffer and self._due:
                try:
                    async with self._turn:
                        await self._settle()
                        batch = self._take(min(len(self._buffer), self._max_batch))
                        if batch:
                            await self._append(batch, led=True)
                except BaseException as exc:
                    self.error = exc
                    self._buffer.clear()
                    self._cancel_timer()
                    self._idle.set()
                    if not isinstance(exc, Exception):
                        raise
                    return
            self._idle_if_empty()


def joined(batch: list[NewEvent]) -> list[NewEvent]:
    """`batch` with each run of adjacent `message.item.delta`s of one item joined into one.

    The joined delta's text is theirs in order, so the item's text, its snapshot and what a
    client rebuilds are the same; the log stores one row, and clients read one frame, where
    they were one per piece (docs/decisions/2024).
    """
    out: list[NewEvent] = []
    texts: list[str] = []  # the texts of the run of deltas that `out[-1]` stands for
    for event in batch:
        if (
            texts
            and event.type == EventType.MESSAGE_ITEM_DELTA
            and _same_but_delta(out[-1].data, event.data)
        ):
            texts.append(event.data["delta"])
            continue
        _join(out, texts)
        out.append(event)
        text = event.data.get("delta")
        texts = (
            [text] if event.type == EventType.MESSAGE_ITEM_DELTA and isinstance(text, str) else []
        )
    _join(out, texts)
    return out


def _join(out: list[NewEvent], texts: list[str]) -> None:
    """Make `out[-1]` the delta of `texts`, if it stands for more than one."""
    if len(texts) > 1:
        out[-1] = NewEvent(out[-1].type, {**out[-1].data, "delta": "".join(texts)})


def _same_but_delta(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two deltas' data differ in their text only, which both hold as strings."""
    return (
        isinstance(a.get("delta"), str)
        and isinstance(b.get("delta"), str)
        and a.keys() == b.keys()
        and all(a[k] == b[k] for k in a if k != "delta")
    )


async def _stored_here(conn: Conn, head: RunHead, batch: list[NewEvent], upto: int) -> bool:
    """Say whether the events right after `head` (up to seq `upto`) are `batch` (by type).

    The append of a run's end may have stored a `plan.updated` closing the plan before it
    (server/events/plans.py); that one is not in the batch.
    """
    cur = await conn.execute(
        # From the days of the run's life only (docs/decisions/2058).
        "SELECT type FROM agentrt_run_events(%s, %s, %s, NULL) ORDER BY seq",
        (head.run_id, head.seq, min(upto, head.seq + len(batch) + 1)),
    )
    found = [r["type"] for r in await cur.fetchall()]
    expected = [e.type for e in batch]
    if EventType.PLAN_UPDATED not in expected:
        found = [t for t in found if t != EventType.PLAN_UPDATED]
    return found[: len(expected)] == expected


def in_order(
    *writes: Callable[[Conn], Awaitable[None]] | None,
) -> Callable[[Conn], Awaitable[None]]:
    """One `before` for an append that runs `writes` (those given) in order."""

    async def write(conn: Conn) -> None:
        for each in writes:
            if each is not None:
                await each(conn)

    return write
