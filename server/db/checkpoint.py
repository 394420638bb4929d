"""LangGraph's Postgres checkpointer, fenced by the run's lease.

A worker whose lease was taken over must not write a checkpoint that wins. Every checkpoint
write of a run executes in one transaction that first takes the run's fence lock (a shared
advisory lock) and checks the lease generation the worker holds (`agentrt_fence()`,
migrations 0006 and 0034). A takeover (the claim, or the recovery of an expired lease) takes
that lock exclusively, without waiting, before it changes the generation: a write in flight
makes it skip the run until the write has committed, and a write that starts after it waits
for it, then fails. The fence locks no row, so it writes no WAL and never waits for the
worker's own event appends (docs/decisions/1980).

A run may also hand the saver a `Rider` (`agentrt_rider` in `configurable`): its writes go in
the same transaction as the checkpoint's, after them. The worker's event writer rides so, and
the events a step queued commit with the step's checkpoint instead of in a transaction of
their own (docs/decisions/2005).
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres import _ainternal
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from server.errors import LeaseLostError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Named with "__", as LangGraph's own keys: LangGraph copies every other `configurable` value
# that is a string or a number into each checkpoint's metadata, which no reader needs.
FENCE_RUN = "__agentrt_run_id"
FENCE_GENERATION = "__agentrt_lease_generation"
FENCE_RIDER = "agentrt_rider"
FENCE_LAST = "agentrt_last_checkpoint"
FENCE_SQLSTATE = "AR001"  # raised by agentrt_fence() (migration 0006)

# How long a run's task writes wait for the checkpoint that ends their step, to go in its
# transaction (docs/decisions/2018); past it they are stored by themselves.
HOLD_WRITES_S = 0.1

# A statement and the rows it is executed for (`executemany`).
_Statement = tuple[str, list[tuple[Any, ...]]]

# What the graph said of its current step's checkpoint (`LastCheckpoint`): the run's last, or
# one that may wait for the next write.
_Word = Literal["last", "deferred"]

# Told how the transaction it rode in ended: None when it committed, else the error (whether
# the commit happened may then be unknown).
Landing = Callable[[BaseException | None], None]


class Rider(Protocol):
    """Writes of a run that may go in the transaction of one of its checkpoint writes."""

    async def board(self, conn: AsyncConnection[DictRow]) -> Landing | None:
        """Run the writes on `conn`, inside the transaction; None if there was nothing to do."""
        ...


@dataclass
class _Fence:
    run_id: str
    generation: int
    rider: Rider | None
    # Set when the rider's statements failed on a connection that is still sound: the
    # checkpoint's own writes can go again without them.
    rider_refused: bool = False


_fence: contextvars.ContextVar[_Fence | None] = contextvars.ContextVar(
    "agentrt_fence", default=None
)


@dataclass
class _Reuse:
    """One thread's latest checkpoint, read once and kept for one reuse."""

    thread: str
    kept: bool = False
    done: bool = False
    found: CheckpointTuple | None = None
    # Known to be absent before any read: the first read is served too, then kept as read.
    absent: bool = False


_reuse: contextvars.ContextVar[_Reuse | None] = contextvars.ContextVar(
    "agentrt_checkpoint_reuse", default=None
)


@contextmanager
def reusing_reads(thread_id: str, *, stored: bool = True) -> Iterator[None]:
    """Serve the thread's latest checkpoint, once read, a second time from memory.

    An attempt reads its thread's state to decide how to start, and the graph's loop reads the
    same checkpoint again as it starts: one round trip and one decoding of the whole history
    too many. Nothing else writes to the thread between the two (the run holds its lease), so
    the second read, and only it, is served from the first; other threads are always read. A
    checkpoint with pending writes is never kept: reading the state applies them to it.

    `stored=False`: the caller knows the thread has no checkpoint (its run's claim looked, in
    the transaction that took the lease); both reads are served "none" without a query.
    """
    token = _reuse.set(_Reuse(thread_id, kept=not stored, absent=not stored))
    try:
        yield
    finally:
        _reuse.reset(token)


@dataclass
class _Held:
    """A run's task writes held for the checkpoint that ends their step."""

    config: RunnableConfig
    statements: list[_Statement]
    timer: asyncio.TimerHandle | None  # None: held for the run's end (`LastCheckpoint`)
    input: bool = False  # holds a run's input checkpoint
    # How many of the first statements are a deferred checkpoint (with what it carried),
    # which an event append may take (`lend`); the rest are the next step's task writes.
    lendable: int = 0


@dataclass
class Lead:
    """Checkpoints held with a time limit, lent to another transaction of the run.

    `write` stores them (first in that transaction, which must roll back whole if the run's
    lease was lost); `landed` is called once it has ended, with its error if it failed.
    """

    write: Callable[[AsyncConnection[Any]], Awaitable[None]]
    landed: Callable[[BaseException | None], None]


def _go_at_once(writes: Sequence[tuple[str, Any]]) -> bool:
    """Whether writes go at once, never held.

    They do if any is to LangGraph's special channels (an interrupt, an error, a resume).
    """
    return any(w[0] in WRITES_IDX_MAP for w in writes)


def _held_key(config: RunnableConfig) -> tuple[str, str, str]:
    configurable = config["configurable"]
    return (
        str(configurable["thread_id"]),
        str(configurable.get("checkpoint_ns", "")),
        str(configurable["checkpoint_id"]),
    )


def _fence_of(config: RunnableConfig) -> _Fence | None:
    """Return the run, lease generation (and rider) a checkpoint write must hold, if any."""
    configurable = config.get("configurable", {})
    if FENCE_RUN in configurable and FENCE_GENERATION in configurable:
        rider = configurable.get(FENCE_RIDER)
        return _Fence(
            str(configurable[FENCE_RUN]),
            int(configurable[FENCE_GENERATION]),
            rider if hasattr(rider, "board") else None,
        )
    return None


class LastCheckpoint:
    """A run's last checkpoint, held for the transaction that records the run's end.

    The graph says, through `expect` (the agent graph's router, as it routes to the end), that
    the checkpoint of its current step will be its last. A `HoldingPostgresSaver` that finds
    this object in `configurable` (`agentrt_last_checkpoint`) then holds that checkpoint
    instead of storing it, and the run's end stores it first in its own transaction
    (`take`), so the run is never recorded as ended without its last state, nor the last
    state without the end (docs/decisions/2021). Should another checkpoint follow after all,
    it takes the held one into its own transaction, as for held task writes.

    The graph may also say, through `defer` (the agent graph's `build_context`), that the
    checkpoint of its current step may wait for the next one: the saver holds it as it holds
    task writes, up to its hold time, for the next checkpoint's transaction (docs/decisions/
    2022). Whatever of it is still held when the run ends goes in the end's transaction too.
    """

    def __init__(self) -> None:
        self._expected: _Word | None = None
        self._held: tuple[HoldingPostgresSaver, tuple[str, str, str]] | None = None

    def expect(self) -> None:
        """Say that the checkpoint of the graph's current step is its last."""
        self._expected = "last"

    def defer(self) -> None:
        """Say that the checkpoint of the graph's current step may wait for the next one.

        Only for a step whose work a later attempt may do again at no cost: a crash before
        the next checkpoint is stored finds neither, and that attempt runs the step again.
        """
        if self._expected is None:
            self._expected = "deferred"

    def _due(self) -> _Word | None:
        """Consume the graph's word: how the next checkpoint is to be held, if at all."""
        due, self._expected = self._expected, None
        return due

    def _keep(self, saver: HoldingPostgresSaver, key: tuple[str, str, str]) -> None:
        self._held = (saver, key)

    def _release(self) -> tuple[HoldingPostgresSaver, _Held] | None:
        """Take the held checkpoint from its saver; None if none is (or a later one took it)."""
        if self._held is None:
            return None
        (saver, key), self._held = self._held, None
        held = saver._release(key)
        return None if held is None else (saver, held)

    def lead(self) -> Lead | None:
        """Lend the checkpoints held with a time limit to the run's next event append.

        A deferred step's events may be stored only with its checkpoint or after it: events
        stored ahead of it would be reported again by the attempt that runs the step again
        after a crash. So the event writer's transaction stores them first
        (docs/decisions/2022). None when nothing is held, or only the run's last checkpoint
        (which waits for the run's end).
        """
        if self._held is None:
            return None
        saver, key = self._held
        return saver.lend(key)

    async def settle(self) -> None:
        """Wait for an event append the held checkpoints were lent to, if one is under way.

        What it stored is then stored; what it failed to store is held again, for `take`.
        """
        if self._held is not None:
            saver, key = self._held
            await saver.stored(key)

    def take(self) -> Callable[[AsyncConnection[Any]], Awaitable[None]] | None:
        """The held checkpoint's write, for the transaction that records the run's end.

        That transaction must roll back if the run's lease was lost (the run's final append
        does: it moves the run's head only under the lease's generation). None when nothing
        is held.
        """
        released = self._release()
        if released is None:
            return None
        statements = released[1].statements

        async def write(conn: AsyncConnection[Any]) -> None:
            async with conn.cursor(binary=True) as cur:
                await _execute(cur, statements)

        return write

    async def store(self) -> None:
        """Store the held checkpoint by itself, fenced (for an end that records no event)."""
        if (released := self._release()) is not None:
            saver, held = released
            await saver._write(held.config, saver._statements_put(held.statements))

    def discard(self) -> None:
        """Drop the held checkpoint (the run's lease was lost: it could not be stored)."""
        self._release()


async def _execute(cur: AsyncCursor[Any], statements: Sequence[_Statement]) -> None:
    for query, params in statements:
        await cur.executemany(query, params)


def _last_of(config: RunnableConfig) -> LastCheckpoint | None:
    last = config.get("configurable", {}).get(FENCE_LAST)
    return last if isinstance(last, LastCheckpoint) else None


class InlinePostgresSaver(AsyncPostgresSaver):
    """`AsyncPostgresSaver` that serialises on the event loop, not in a thread.

    `aput` and `aput_writes` store what `AsyncPostgresSaver.aput` and `aput_writes` store (the
    version uv.lock pins; tests/integration/test_checkpoint_inline.py compares the rows with
    the base class's), but for one thing: the values are serialised on the event loop, not in
    a thread (`asyncio.to_thread`). The serializer holds the GIL throughout, so the thread let
    nothing else run meanwhile; each hop cost about 55 us of CPU and as much latency, some 15
    times per run (docs/decisions/2016). Both go through `_write`, which a subclass may wrap.
    The versions it gives channels are shorter than the base class's (`get_next_version`).
    """

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """The version a channel's next value takes: the base class's, with a shorter tail.

        `{n:032}.{tail}`, as the base class writes it: the 32 digits order a channel's versions
        as text, and the random tail tells apart the versions that two writers of the same
        checkpoint give a channel (a blob is keyed by its version; a second attempt of a
        step, or a fork, writes again from the same checkpoint). The base class's tail is a
        float's text (about 18 characters, 52 random bits); this one is 8 characters of
        URL-safe base64 (48 bits). A version is written many times over (each checkpoint's
        `channel_versions` and `versions_seen`, each blob's key): about 0.9 KiB less per
        run of the agent graph. Any saver reads and continues these versions, which parse
        as the base class's do (docs/decisions/2045).
        """
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        tail = base64.urlsafe_b64encode(random.getrandbits(48).to_bytes(6, "big")).decode()
        return f"{number + 1:032}.{tail}"

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint, as the base class does, serialising on the event loop."""
        carried = await self._carried(config)
        statements, stored = self._checkpoint_statements(config, checkpoint, metadata, new_versions)
        await self._write(config, self._statements_put([*carried, *statements]))
        return stored

    async def _carried(self, config: RunnableConfig) -> Sequence[_Statement]:
        """Task writes to store first in the transaction of the checkpoint `config` puts."""
        return ()

    def _checkpoint_statements(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[list[_Statement], RunnableConfig]:
        """The statements storing a checkpoint, its values serialised now; and its config."""
        configurable = config["configurable"].copy()
        thread_id = configurable.pop("thread_id")
        checkpoint_ns = configurable.pop("checkpoint_ns")
        checkpoint_id = configurable.pop("checkpoint_id", None)
        copy = checkpoint.copy()
        copy["channel_values"] = copy["channel_values"].copy()
        # Primitive values stay inline in the checkpoint's row; the others go to blobs.
        blob_values = {}
        for key, value in checkpoint["channel_values"].items():
            if isinstance(value, _DeltaSnapshot):
                blob_values[key] = copy["channel_values"].pop(key)
                copy["channel_values"][key] = True
            elif value is None or isinstance(value, (str, int, float, bool)):
                pass
            else:
                blob_values[key] = copy["channel_values"].pop(key)
        statements: list[_Statement] = []
        if blob_versions := {k: v for k, v in new_versions.items() if k in blob_values}:
            statements.append(
                (
                    self.UPSERT_CHECKPOINT_BLOBS_SQL,
                    self._dump_blobs(thread_id, checkpoint_ns, blob_values, blob_versions),
                )
            )
        row = (
            thread_id,
            checkpoint_ns,
            checkpoint["id"],
            checkpoint_id,
            Jsonb(copy),
            Jsonb(get_serializable_checkpoint_metadata(config, metadata)),
        )
        statements.append((self.UPSERT_CHECKPOINTS_SQL, [row]))
        stored: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        return statements, stored

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes, as the base class does, serialising on the event loop."""
        statement = self._writes_statement(config, writes, task_id, task_path)
        if statements := self._to_store(config, writes, statement):
            await self._write(config, self._statements_put(statements))

    def _to_store(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], statement: _Statement
    ) -> list[_Statement]:
        """What a task's writes store now: their statement (none if it waits for later)."""
        return [statement]

    def _writes_statement(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> _Statement:
        """The statement that stores a task's writes, its values serialised now."""
        query = (
            self.UPSERT_CHECKPOINT_WRITES_SQL
            if all(w[0] in WRITES_IDX_MAP for w in writes)
            else self.INSERT_CHECKPOINT_WRITES_SQL
        )
        configurable = config["configurable"]
        params = self._dump_writes(
            configurable["thread_id"],
            configurable["checkpoint_ns"],
            configurable["checkpoint_id"],
            task_id,
            task_path,
            writes,
        )
        return query, params

    def _statements_put(self, statements: Sequence[_Statement]) -> Callable[[], Awaitable[None]]:
        """The write that runs `statements` (a checkpoint's, task writes), in one transaction."""

        async def put() -> None:
            async with self._cursor(pipeline=True) as cur:
                await _execute(cur, statements)

        return put

    async def _write(self, config: RunnableConfig, write: Callable[[], Awaitable[T]]) -> T:
        """Run one of the writes of `aput` or `aput_writes`; here, as it is."""
        return await write()


class HoldingPostgresSaver(InlinePostgresSaver):
    """`InlinePostgresSaver` that stores a step's task writes with the step's checkpoint.

    LangGraph stores a task's writes as the task ends and the step's checkpoint right after,
    in two transactions. Task writes that `_holds` accepts are held, up to `hold_writes_s`,
    for the checkpoint that ends their step, and go first in its transaction
    (docs/decisions/2018). Writes to LangGraph's special channels (an interrupt, an error, a
    resume, a scheduled task) are followed by no checkpoint: they go at once, with whatever
    was held for their checkpoint. Held writes whose checkpoint does not come in time are
    stored by themselves. A run's input checkpoint is held the same way, with its writes, for
    the first step's checkpoint, and so is a checkpoint the graph says may wait for the next.
    """

    def __init__(self, *args: Any, hold_writes_s: float = HOLD_WRITES_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hold_writes_s = hold_writes_s
        # Task writes waiting for their step's checkpoint, by (thread, namespace, checkpoint),
        # and those that waited too long, being stored by themselves.
        self._held: dict[tuple[str, str, str], _Held] = {}
        self._storing: dict[tuple[str, str, str], asyncio.Future[None]] = {}

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; a run's input and last checkpoints wait to go with another write.

        LangGraph stores the input as a checkpoint of its own, then runs its own `__start__`
        task (which only copies the input into the state's channels) and stores the first
        step's checkpoint. Held like task writes, the input checkpoint and `__start__`'s writes
        go first in that checkpoint's transaction: one transaction fewer before the first node
        runs, and a crash between the two finds neither, as one during `__start__` would
        (docs/decisions/2019). In a run whose graph passes a `LastCheckpoint`, the first step's
        checkpoint and one the graph says may wait (`LastCheckpoint.defer`) are held the same
        way, for the next checkpoint's transaction (docs/decisions/2022). A
        checkpoint the graph calls its last (`LastCheckpoint.expect`) is held with no time
        limit, for the transaction that records the run's end (docs/decisions/2021).
        """
        source = metadata.get("source")
        last = _last_of(config)
        word: _Word | None = None
        # The graph's word is consumed by its own namespace's next step checkpoint only.
        if (
            last is not None
            and source == "loop"
            and not config["configurable"].get("checkpoint_ns")
        ):
            word = last._due()
            if word is None and self._after_input(config):
                # The first step's: a later attempt copies the input again (`__start__`).
                word = "deferred"
        last_one = word == "last"
        timed = (source == "input" or word == "deferred") and self._hold_writes_s > 0
        if not ((timed or last_one) and self._holds(config)):
            return await super().aput(config, checkpoint, metadata, new_versions)
        carried = await self._carried(config)
        statements, stored = self._checkpoint_statements(config, checkpoint, metadata, new_versions)
        key = _held_key(stored)
        self._hold(key, config, [*carried, *statements], timed=not last_one)
        if not last_one:
            self._held[key].lendable = len(self._held[key].statements)
        if source == "input":
            self._held[key].input = True
        if last is not None and word is not None:
            last._keep(self, key)
        return stored

    def _after_input(self, config: RunnableConfig) -> bool:
        """Whether `config` names a run's input checkpoint, still held."""
        if get_checkpoint_id(config) is None:
            return False
        held = self._held.get(_held_key(config))
        return held is not None and held.input

    async def _carried(self, config: RunnableConfig) -> Sequence[_Statement]:
        """What is held for the checkpoint `config` puts: its parent's writes (and parent)."""
        if not self._holds(config) or get_checkpoint_id(config) is None:
            return ()
        # Writes that waited too long, or were lent to an event append, may be being stored:
        # they go first, as LangGraph's would (a checkpoint may rely on them, a delta
        # channel's for one). What a failed append gives back is held again meanwhile.
        await self.stored(_held_key(config))
        return self._take(config)

    async def stored(self, key: tuple[str, str, str]) -> None:
        """Wait for a store under way of what was held under `key`, if one is.

        Such a store is what waited past its hold, or what was lent to an event append.
        """
        if (storing := self._storing.get(key)) is not None:
            await asyncio.wait([storing])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store or hold a task's writes (`_to_store`).

        Writes that go at once (an interrupt, an error) first wait for a store under way of
        what was held for their checkpoint (lent to an event append, or past its hold), so
        they are never stored ahead of it; what a failed append gives back goes with them.
        """
        if self._holds(config) and get_checkpoint_id(config) is not None and _go_at_once(writes):
            await self.stored(_held_key(config))
        await super().aput_writes(config, writes, task_id, task_path)

    def _to_store(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], statement: _Statement
    ) -> list[_Statement]:
        """Hold regular writes for the step's checkpoint; the others go with what was held."""
        if not self._holds(config):
            return [statement]
        if self._hold_writes_s > 0 and not _go_at_once(writes):
            self._hold(_held_key(config), config, [statement])
            return []
        return [*self._take(config), statement]

    def _hold(
        self,
        key: tuple[str, str, str],
        config: RunnableConfig,
        statements: list[_Statement],
        *,
        timed: bool = True,
    ) -> None:
        """Hold `statements` for the checkpoint `key` names; `config` carries the fence.

        Timed: stored by themselves once the hold runs out. Untimed: held for the run's end
        (`LastCheckpoint`), which takes or stores them whatever way it ends.
        """
        held = self._held.get(key)
        if held is None:
            timer = (
                asyncio.get_running_loop().call_later(self._hold_writes_s, self._store_held, key)
                if timed
                else None
            )
            held = self._held[key] = _Held(config, [], timer)
        held.statements.extend(statements)

    def _take(self, config: RunnableConfig) -> list[_Statement]:
        """Take what is held for the checkpoint `config` names."""
        held = self._release(_held_key(config))
        return [] if held is None else held.statements

    def _release(self, key: tuple[str, str, str]) -> _Held | None:
        """Take what is held for the checkpoint `key` names, its timer stopped."""
        held = self._held.pop(key, None)
        if held is not None and held.timer is not None:
            held.timer.cancel()
        return held

    def lend(self, key: tuple[str, str, str]) -> Lead | None:
        """Lend what is held with a time limit for `key` to another transaction of the run.

        Until that transaction has ended, the next checkpoint waits for it, as for writes
        stored after their hold ran out. If it failed, what was lent is held again.
        """
        held = self._held.get(key)
        if held is None or held.timer is None or not held.lendable:
            return None
        config, statements = held.config, held.statements[: held.lendable]
        if held.lendable < len(held.statements):
            # The next step's task writes stay held for its checkpoint.
            del held.statements[: held.lendable]
            held.lendable = 0
        else:
            self._release(key)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._storing[key] = done

        async def write(conn: AsyncConnection[Any]) -> None:
            async with conn.cursor(binary=True) as cur:
                await _execute(cur, statements)

        def landed(exc: BaseException | None) -> None:
            if exc is not None:
                # Not stored (or not known to be): held again, ahead of anything held for the
                # same checkpoint since, for the next checkpoint or the hold's end. Stored
                # twice at worst, which a checkpoint's rows allow (they are upserted).
                self._hold(key, config, [])
                again = self._held[key]
                again.statements[:0] = statements
                again.lendable = len(statements)
            if self._storing.get(key) is done:
                del self._storing[key]
            if not done.done():
                done.set_result(None)

        return Lead(write, landed)

    def _store_held(self, key: tuple[str, str, str]) -> None:
        """Store writes whose checkpoint did not come in time, by themselves."""
        held = self._release(key)
        if held is None:
            return
        task = asyncio.ensure_future(
            self._write(held.config, self._statements_put(held.statements))
        )
        self._storing[key] = task
        task.add_done_callback(lambda done: self._stored(key, done))

    def _stored(self, key: tuple[str, str, str], task: asyncio.Future[None]) -> None:
        if self._storing.get(key) is task:
            del self._storing[key]
        if not task.cancelled() and (exc := task.exception()) is not None:
            # As when LangGraph's own background write fails: the step's checkpoint, if it
            # comes, holds what they wrote; if it does not, a later attempt runs the task again.
            log.warning("task writes held for a checkpoint could not be stored: %s", exc)

    def _holds(self, config: RunnableConfig) -> bool:
        """Say whether task writes stored under `config` may be held; here, all."""
        return True


class FencedPostgresSaver(HoldingPostgresSaver):
    """`HoldingPostgresSaver` whose writes for a leased run are refused once the lease is lost.

    Runs pass `__agentrt_run_id` and `__agentrt_lease_generation` in `configurable` (and may pass
    a `Rider` as `agentrt_rider`); writes without them (LangGraph tooling, tests) behave
    exactly as `InlinePostgresSaver`; a run's task writes are held for its step's checkpoint.
    """

    def _holds(self, config: RunnableConfig) -> bool:
        """Hold the task writes of runs only (those with a fence)."""
        return _fence_of(config) is not None

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Read a checkpoint; inside `reusing_reads()`, its thread's latest only once."""
        reuse = _reuse.get()
        configurable = config.get("configurable", {})
        if (
            reuse is None
            or reuse.done
            or str(configurable.get("thread_id")) != reuse.thread
            or configurable.get("checkpoint_ns")
            or get_checkpoint_id(config)
        ):
            return await super().aget_tuple(config)
        if reuse.absent:  # the first read of a thread known to have no checkpoint
            reuse.absent = False
            return None
        if reuse.kept:
            reuse.done, found, reuse.found = True, reuse.found, None
            return found
        found = await super().aget_tuple(config)
        if found is None or not found.pending_writes:
            reuse.kept, reuse.found = True, found
        else:
            reuse.done = True
        return found

    async def _write(self, config: RunnableConfig, write: Callable[[], Awaitable[T]]) -> T:
        """Run `write` under the config's fence; again without the rider if only it failed.

        A checkpoint does not wait on the event log: when the rider's statements are refused
        (the log's table refuses a row, say) on a sound connection, the rider has taken its
        events back, and the checkpoint's own writes go again, alone.
        """
        fence = _fence_of(config)
        token = _fence.set(fence)
        try:
            try:
                return await write()
            except psycopg.Error as exc:
                if fence is None or not fence.rider_refused:
                    raise
                log.warning(
                    "run %s: a checkpoint write failed with the run's events (%s); "
                    "writing it without them",
                    fence.run_id,
                    exc,
                )
                _fence.set(_Fence(fence.run_id, fence.generation, None))
                return await write()
        finally:
            _fence.reset(token)

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        fence = _fence.get()
        if fence is None:
            async with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        run_id, generation = fence.run_id, fence.generation
        if fence.rider is not None:
            # A task's writes are stored by a task LangGraph starts as the step's task ends,
            # one loop turn before its stream hands the step's parts (its `updates`) to the
            # run: yielding once lets them reach the rider, so they commit with these writes
            # and not after the step's checkpoint, which a crash would make them miss (a
            # resumed graph does not stream a finished step again).
            await asyncio.sleep(0)
        # The base class serialises on self.lock because it may own a single connection;
        # with a pool each write has its own connection, so runs need not wait for each other.
        # Pipelined with no BEGIN: everything up to the one Sync at the end runs as a single
        # implicit transaction, so the fence, the writes and the rider's writes commit (or
        # fail) together, and the fence's lock is held until then.
        # The rider reads nothing either: its statements' errors, like the writes', arrive
        # at the sync.
        landing: Landing | None = None
        boarding = False
        conn: AsyncConnection[DictRow] | None = None
        try:
            async with (
                _ainternal.get_connection(self.conn) as conn,
                conn.pipeline(),
                conn.cursor(binary=True, row_factory=dict_row) as cur,
            ):
                await cur.execute("SELECT agentrt_fence(%s, %s)", (run_id, generation))
                yield cur
                if fence.rider is not None:
                    boarding = True  # a rider that raises may have sent some of its writes
                    landing = await fence.rider.board(conn)
                    boarding = landing is not None
        except BaseException as exc:
            if landing is not None:
                landing(exc)
            # Its events are back with the rider. An ERROR (not FATAL: the session lives) that
            # is not the fence's may be theirs: the write goes again without them.
            if (
                boarding
                and isinstance(exc, psycopg.Error)
                and exc.diag.severity_nonlocalized == "ERROR"
                and exc.sqlstate != FENCE_SQLSTATE
                and conn is not None
                and not conn.broken
            ):
                fence.rider_refused = True
            if isinstance(exc, psycopg.Error) and exc.sqlstate == FENCE_SQLSTATE:
                raise LeaseLostError(
                    f"run {run_id}: checkpoint refused, lease generation {generation} superseded"
                ) from exc
            raise
        if landing is not None:
            landing(None)
