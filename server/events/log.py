"""The per-run event log: gapless `seq`, the run's snapshot, and live notification.

Every append allocates the next `seq` values under a conditional update of the run's row,
folds the events into the run's snapshot, moves the run's status, and NOTIFYs listeners,
atomically (one statement, or one transaction when the row must be read first).

The snapshot is stored (`run_snapshots`) whenever no worker holds the run after the append,
and every `LAG_MAX` events while one does; the worker keeps it folded in its head meanwhile.
Readers fold the events after the stored one's `seq` from the log (docs/decisions/2010). A
new run has none until a later append stores it: its first events are few (docs/decisions/2044).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncCursor, Error
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.types.json import Jsonb

from graphs.events import EventType
from server import jsontext
from server.db.pool import Conn, pipelined_transaction
from server.domain import RunStatus, is_terminal
from server.errors import LeaseLostError, RunFinishedError, RunNotFoundError
from server.events import answers, calls, manifests
from server.events.carry import carried_head, pointer, stamp, wire_event
from server.events.channels import EVENTS_CHANNEL, RUNS_CHANNEL
from server.events.plans import closing_update
from server.events.snapshot import (
    Snapshot,
    apply_event,
    awaits_children,
    copy_snapshot,
    empty_snapshot,
)
from server.events.store import (
    KEEP_SNAPSHOT,
    STATEMENT_MAX,
    StoredEvent,
    StoreHook,
    not_appended,
    store_batch,
)

__all__ = ["StoreHook", "StoredEvent"]  # where the rest of the server finds them

# What may follow a run's final event: memory extraction's report and its model usage.
AFTER_END_EVENTS = frozenset({EventType.MEMORY_UPDATED, EventType.USAGE})
# The most events a stored snapshot may lag behind the log while a worker holds the run: what
# a reader folds at most, for the snapshot route or a head taken over after a crash.
LAG_MAX = 256


@dataclass
class NewEvent:
    """An event before it is stored: `seq` and `ts` are given at append time."""

    type: EventType
    data: Mapping[str, Any] = field(default_factory=dict)


def encode_event(run_id: str, seq: int, kind: str, ts: datetime, data_json: str) -> str:
    """Build the wire JSON of an event from its parts; `data_json` is already JSON text."""
    return wire_event(run_id, seq, kind, stamp(ts), data_json)


@dataclass
class RunHead:
    """What an appender must know of a run: its last seq, status, snapshot and lease.

    `snapshot` folds every event up to `seq`; `snapshot_seq` is the last event the stored one
    folds (`run_snapshots`), which an append may leave behind (docs/decisions/2010).
    """

    run_id: str
    seq: int
    status: str
    attempt: int
    snapshot: Snapshot
    generation: int
    snapshot_seq: int = 0


# The stored snapshot's columns, from `run_snapshots s` (none for a new run): rows stored
# before keep `jsonb`, the others the text the appender sent (docs/decisions/2049), which
# the server parses alike.
SNAPSHOT_COLUMNS = "s.seq AS snapshot_seq, s.snapshot, s.snapshot_text"


async def load_head(conn: Conn, run_id: str, *, lock: bool) -> RunHead:
    """Read the run's head, locking its row when `lock` (inside a transaction).

    `FOR NO KEY UPDATE`, the lock the API's posts and cancels take first: taking it again here
    is no upgrade, which could wait on rows referencing the run (docs/decisions/1020).
    """
    cur = await conn.execute(
        "SELECT r.last_event_seq, r.status, r.attempt, r.lease_generation,"
        f" {SNAPSHOT_COLUMNS} FROM runs r LEFT JOIN run_snapshots s ON s.run_id = r.id"
        " WHERE r.id = %s" + (" FOR NO KEY UPDATE OF r" if lock else ""),
        (run_id,),
    )
    row = await cur.fetchone()
    if row is None:
        raise RunNotFoundError(run_id)
    return await fold_tail(conn, head_of(run_id, row))


def head_of(run_id: str, row: Mapping[str, Any]) -> RunHead:
    """The head of a run from its `runs` row and stored snapshot (`SNAPSHOT_COLUMNS`).

    The snapshot may lag behind `last_event_seq`: `fold_tail` brings it up to date.
    """
    return RunHead(
        run_id,
        row["last_event_seq"],
        row["status"],
        row["attempt"],
        row["snapshot"] or row["snapshot_text"] or empty_snapshot(run_id),
        row["lease_generation"],
        row["snapshot_seq"] or 0,
    )


# The events a stored snapshot lags behind, within the run's lifetime (see `READ_EVENTS`).
# A manifest's stub is folded as it is stored: the snapshot takes nothing from a manifest.
_TAIL = """
SELECT seq, type, data FROM agentrt_run_events(%(run)s, %(after)s, %(upto)s, NULL)
ORDER BY seq
"""


# The same events as one JSON array, for a statement that reads them with the run's row:
# `{run}` and `{after}` are its SQL for the run's row and the stored snapshot's seq. Read,
# as a replay's are, from the days of the run's lifetime only (`READ_EVENTS`).
TAIL_JSON = """(SELECT json_agg(json_build_object('seq', e.seq, 'type', e.type, 'data', e.data)
    ORDER BY e.seq) FROM agentrt_run_events({run}.id, COALESCE({after}, 0), NULL, NULL) e)"""


async def fold_tail(
    conn: Conn, head: RunHead, rows: Sequence[Mapping[str, Any]] | None = None
) -> RunHead:
    """Return `head` with the events after its stored snapshot folded into its snapshot.

    Those events are the run's own and never change: any statement that sees the run at
    `head.seq` finds them in the log. `rows` are those events when the caller's statement
    has read them already (`TAIL_JSON`), each with its `seq`, `type` and `data`.
    """
    if head.snapshot_seq >= head.seq:
        return head
    if rows is None:
        cur = await conn.execute(
            _TAIL, {"run": head.run_id, "after": head.snapshot_seq, "upto": head.seq}
        )
        rows = await cur.fetchall()
    if len(rows) != head.seq - head.snapshot_seq:
        raise RuntimeError(
            f"run {head.run_id}: the log holds {len(rows)} of the events"
            f" {head.snapshot_seq + 1}..{head.seq} its snapshot lags behind"
        )
    snapshot = copy_snapshot(head.snapshot)
    for row in rows:
        apply_event(snapshot, row["seq"], row["type"], row["data"])
    return replace(head, snapshot=snapshot)


def new_head(run_id: str) -> RunHead:
    """The head of a run just inserted in the caller's transaction, before `run.created`."""
    return RunHead(run_id, 0, "queued", 0, empty_snapshot(run_id), 0)


async def append_creating(
    conn: Conn, run_id: str, events: list[NewEvent], statement: str, values: Mapping[str, Any]
) -> tuple[RunHead, AsyncCursor[Any]]:
    """Send the statement that inserts a new run's row with its first `events` (not read).

    Args:
        conn: A connection inside the caller's transaction; pipelined, the statement goes out
            with the next one whose result is read, or with the `COMMIT`.
        run_id: The new run's id.
        events: Its first events, `run.created` first; at most `STATEMENT_MAX`.
        statement: `server.events.store.creating_statement` of the run's `INSERT`.
        values: The `INSERT`'s own parameters, besides the append's.

    Returns:
        The run's head after the events, and the statement's cursor: its one row (the run's
        row, and `carried`, the events as a notification carries them) is read once the
        caller's transaction has committed.
    """
    now = datetime.now(UTC)
    head = new_head(run_id)
    new, stored = fold_events(head, events, now)
    params = _params(head, new, stored, None, now)
    if params["kept_calls"] or params["manifests"]:
        # The creating statement runs no store hook and stores no manifest: a kept call or a
        # manifest would lose its row.
        raise ValueError("a run's first events report no model call and no context")
    # No snapshot yet: a reader folds the run's first events from the log, and the claim
    # reads them with the run's row (`TAIL_JSON`). The run's end stores it (docs/decisions/2044).
    params["snapshot"] = None
    cursor = await conn.execute(statement, {**params, **values})
    return new, cursor


async def started_by_claim(conn: Conn, row: Mapping[str, Any], ts: datetime, data: str) -> RunHead:
    """The head of a run whose claim's statement appended its `run.started` (`data`, at `ts`).

    `row` is the run's row as the claim left it, with its stored snapshot
    (`SNAPSHOT_COLUMNS`) and the events after it (`tail`, `TAIL_JSON`): the head before the
    event is folded as any reader's, then the event onto it here, as its append would have.
    The snapshot is stored, in the caller's transaction, only if it would otherwise lag more
    than `LAG_MAX` events (a run taken over from a worker that lost it): the claimer holds
    the run (docs/decisions/2010).
    """
    run_id = row["id"]
    before = await fold_tail(
        conn,
        head_of(run_id, {**row, "last_event_seq": row["last_event_seq"] - 1, "status": "queued"}),
        row["tail"] or (),
    )
    head, _ = fold_events(before, [NewEvent(_RUN_STARTED, json.loads(data))], ts)
    if head.seq != row["last_event_seq"]:
        raise RuntimeError(f"run {run_id}: the claim's run.started is not seq {head.seq}")
    if head.seq - head.snapshot_seq > LAG_MAX:
        await conn.execute(
            KEEP_SNAPSHOT,
            {"id": run_id, "seq": head.seq, "snapshot": jsontext.dumps(head.snapshot)},
        )
        head = replace(head, snapshot_seq=head.seq)
    return head


_RUN_STARTED = EventType.RUN_STARTED  # looked up once: the fold runs for every event


async def append_events(
    conn: Conn,
    run_id: str,
    events: list[NewEvent],
    *,
    generation: int | None = None,
    head: RunHead | None = None,
    extra: Callable[[Conn, RunHead], Awaitable[None]] | None = None,
    hooks: Sequence[StoreHook] = (),
    before: Callable[[Conn], Awaitable[None]] | None = None,
) -> tuple[RunHead, list[StoredEvent]]:
    """Append `events` to the run's log atomically and return the new head.

    Args:
        conn: A connection from the pool (autocommit), or one inside the caller's transaction
            (a pipelined one's included, such as a checkpoint write's: the append opens no
            transaction there, and carries at most `STATEMENT_MAX` events).
        run_id: The run.
        events: Events in order.
        generation: The caller's lease generation (fencing token); None for callers that act
            on unleased runs, such as the API cancelling a queued run.
        head: The caller's cached head (a worker's, from its previous append). The update is
            then conditional on nobody else having appended since, and the append is a single
            statement; otherwise the row is locked and read first.
        extra: Runs in the same transaction after the events are stored (e.g. store the
            assistant message together with `run.completed`).
        hooks: Write rows derived from events of their types in the same transaction.
        before: Runs in the same transaction before the run's row is locked or updated, for
            rows that need no head: the row is then held for less time.

    Raises:
        LeaseLostError: `generation` is no longer the run's lease generation, or someone else
            appended after `head`. On a connection the caller pipelined, the latter is known
            only at the caller's sync: it raises there, as a psycopg error that `not_appended`
            recognises, and the caller's transaction rolls back.
        RunFinishedError: the run is already terminal.
        IllegalTransitionError: an event would move the status along a forbidden edge.
    """
    if head is not None and extra is None and before is None:
        return await _append(conn, head, events, generation, hooks)
    try:
        async with _transaction(conn, events):
            if before is not None:
                await before(conn)
            if head is None:
                head = await load_head(conn, run_id, lock=True)
                if generation is not None and head.generation != generation:
                    raise LeaseLostError(f"run {run_id}: lease generation {generation} superseded")
            # Pipelined, nothing here is read: `extra`'s rows go out with the append and the
            # COMMIT, in one round trip, and roll back with an append that moved no head.
            new_head, stored = await _append(conn, head, events, generation, hooks)
            if extra is not None:
                await extra(conn, new_head)
    except Error as exc:
        if not_appended(exc):
            raise LeaseLostError(f"run {run_id}: appended to by someone else") from exc
        raise
    return new_head, stored


def _transaction(conn: Conn, events: list[NewEvent]) -> AbstractAsyncContextManager[Any]:
    """The append's transaction: pipelined when it can be.

    Pipelined, the statements nobody reads (the rows of `extra`, the hooks') go out with the
    `COMMIT`, in one round trip (docs/decisions/2011). On a connection already pipelined,
    the caller's transaction holds the append (its `pipelined_transaction`, or the implicit
    one up to the pipeline's sync): in a pipeline, libpq knows a transaction's status only
    at a sync, so psycopg's `transaction()` could take the caller's for none and commit it.
    A batch for COPY, which a pipeline cannot carry, or a connection in the caller's
    transaction, gets psycopg's `transaction()` (a savepoint in the latter case).
    """
    if conn.info.pipeline_status != PipelineStatus.OFF:
        return contextlib.nullcontext()
    # A closing plan update may join the batch: one event of margin.
    if len(events) < STATEMENT_MAX and conn.info.transaction_status == TransactionStatus.IDLE:
        return pipelined_transaction(conn)
    return conn.transaction()


async def _append(
    conn: Conn,
    head: RunHead,
    events: list[NewEvent],
    generation: int | None,
    hooks: Sequence[StoreHook],
) -> tuple[RunHead, list[StoredEvent]]:
    after_end = is_terminal(head.status)
    # Only unleased writers (the memory jobs) add to a finished run, and only what may follow.
    if after_end and (
        generation is not None or any(e.type not in AFTER_END_EVENTS for e in events)
    ):
        raise RunFinishedError(head.run_id, head.status)
    now = datetime.now(UTC)
    new, stored = fold_events(head, events, now)
    params = _params(head, new, stored, generation, now)
    if any(jsontext.NUL_ESCAPE in data for data in params["datas"]):
        # Postgres text and jsonb cannot hold a NUL character (a model's or a tool's text may):
        # the batch is stored, folded and streamed with U+FFFD in its place.
        events = [NewEvent(e.type, jsontext.storable(e.data)) for e in events]
        new, stored = fold_events(head, events, now)
        params = _params(head, new, stored, generation, now)
    if params["snapshot"] is not None:
        new = replace(new, snapshot_seq=new.seq)
    # Events that hooks write rows for are stored in one transaction with those rows; the
    # calls kept in their rows only are written so whatever the caller hands in.
    if params["kept_calls"]:
        hooks = [*hooks, calls.HOOK]
    hooked = [(h, [e for e in stored if e.type in h.types]) for h in hooks]
    hooked = [(h, found) for h, found in hooked if found]
    if not await store_batch(conn, params, stored, hooked):
        raise LeaseLostError(f"run {head.run_id}: appended to by someone else")
    return new, stored


def fold_events(
    head: RunHead, events: list[NewEvent], now: datetime
) -> tuple[RunHead, list[StoredEvent]]:
    """Give `events` their seq values and fold them into a copy of the head's snapshot."""
    # A copy, so that a failed append leaves the caller's cached head untouched.
    snapshot = copy_snapshot(head.snapshot)
    stored: list[StoredEvent] = []
    seq = head.seq
    attempt = head.attempt
    for event in events:
        items = _closing_plan(snapshot, event) if "plan" in snapshot else (event,)
        for item in items:
            seq += 1
            if item.type == _RUN_STARTED:
                attempt = item.data.get("attempt", attempt)
            apply_event(snapshot, seq, item.type, item.data)
            stored.append(StoredEvent(head.run_id, seq, item.type, now, item.data))
    new = RunHead(
        head.run_id, seq, snapshot["status"], attempt, snapshot, head.generation, head.snapshot_seq
    )
    return new, stored


def _closing_plan(snapshot: Snapshot, event: NewEvent) -> list[NewEvent]:
    """Return `event`, after a `plan.updated` closing the plan's open steps if it ends the run."""
    update = closing_update(snapshot, event.type)
    return [event] if update is None else [NewEvent(EventType.PLAN_UPDATED, update), event]


def _params(
    head: RunHead, new: RunHead, stored: list[StoredEvent], generation: int | None, now: datetime
) -> dict[str, Any]:
    """Return the parameters of the append's statements (server/events/store.py)."""
    status = new.status
    after_end = is_terminal(head.status)
    failed = next((e for e in reversed(stored) if e.type == EventType.RUN_FAILED), None)
    completed = next((e for e in reversed(stored) if e.type == EventType.RUN_COMPLETED), None)
    usage_changed = any(e.type == EventType.USAGE for e in stored)
    datas = [jsontext.dumps(e.data) for e in stored]
    stubs = [manifests.stub_text(e.type, e.data) for e in stored]
    call_stubs = [calls.stub(e.type, e.data) for e in stored]
    # Events the log keeps a stub of, with their whole data for the notification: a model
    # call's (its ledger row holds the rest), or a run's answer and its item's text (its
    # message holds them).
    items = answers.item_stubs(head.snapshot, stored)
    wholes = [
        call if call is not None else answers.stub(e.type, e.data) or item
        for e, call, item in zip(stored, call_stubs, items, strict=True)
    ]
    release = (
        is_terminal(status)
        or status in (RunStatus.QUEUED, RunStatus.WAITING_USER, RunStatus.PAUSED)
        # A parent waiting for its child runs holds no worker (docs/subagents.md).
        or (status == RunStatus.WAITING_TOOL and awaits_children(new.snapshot))
    )
    # Stored unless a worker goes on holding the run and will store it later: every reader
    # without the worker's head folds at most `LAG_MAX` events from the log.
    held = generation is not None and not release and new.seq - head.snapshot_seq <= LAG_MAX
    return {
        "seq": new.seq,
        # JSON text, not `Jsonb`: Postgres parses it into the jsonb column all the same.
        "snapshot": None if held else jsontext.dumps(new.snapshot),
        "status": status,
        "terminal": is_terminal(status),
        "after_end": after_end,
        "release": release,
        "error_type": failed.data.get("errorType") if failed else None,
        "error_message": failed.data.get("message") if failed else None,
        "error_details": Jsonb(error_details(failed.data)) if failed else None,
        # The run's answer, stored by the appender in the same transaction (its `extra`).
        "output_message_id": completed.data.get("outputMessageId") if completed else None,
        "usage": Jsonb(new.snapshot.get("usage", {})) if usage_changed else None,
        "id": head.run_id,
        "prev": head.seq,
        "generation": generation,
        "ts": now,
        "attempt": new.attempt,
        # The batch as one JSON array: psycopg dumps one string in C, where three arrays
        # went through its Python array dumper, element by element.
        "events": _batch_json(stored, datas, stubs, wholes),
        "datas": datas,
        # What the log stores of each event (COPY): a manifest's, a call's or an answer's
        # stub, or the data.
        "stored_datas": [
            stub if stub is not None else whole[0] if whole is not None else data
            for data, stub, whole in zip(datas, stubs, wholes, strict=True)
        ],
        "manifests": any(stub is not None for stub in stubs),
        "kept_calls": any(call is not None for call in call_stubs),
        "events_channel": EVENTS_CHANNEL,
        "payload": pointer(head.run_id, new.seq),
        "carried": carried_head(head.run_id, new.seq, now),
        "runs_channel": RUNS_CHANNEL,
        "queued": status == RunStatus.QUEUED,
    }


def _batch_json(
    stored: list[StoredEvent],
    datas: list[str],
    stubs: list[str | None],
    wholes: list[tuple[str, str] | None],
) -> str:
    """Return the batch as the JSON array `[{"seq": …, "type": …, "data": …}, …]`.

    Each data is already JSON text, and is put in as it is. An event whose manifest is kept
    in its table has its stub as `data`, its data's text, as a JSON string, as `manifest`,
    and the text the table keeps, when it is not that, as `kept` (server/events/manifests.py
    `kept_text`). An event whose call is kept in its ledger row, or whose answer its message
    keeps, has its stub as `data` and its whole data as `whole` (calls.py, answers.py).
    """
    rows = []
    for e, data, stub, whole in zip(stored, datas, stubs, wholes, strict=True):
        head = f'{{"seq":{e.seq},"type":{jsontext.dumps(str(e.type))},"data":'
        if stub is not None:
            kept = manifests.kept_text(e.data)
            tail = "" if kept is None else f',"kept":{jsontext.dumps(kept)}'
            rows.append(f'{head}{stub},"manifest":{jsontext.dumps(data)}{tail}}}')
        elif whole is not None:
            rows.append(f'{head}{whole[0]},"whole":{whole[1]}}}')
        else:
            rows.append(f"{head}{data}}}")
    return "[" + ",".join(rows) + "]"


def error_details(data: Mapping[str, Any]) -> dict[str, Any]:
    """Return what a `run.failed` event says beyond its type and message."""
    return {k: v for k, v in data.items() if k not in ("errorType", "message")}


# An event's data as it was appended, for a read of `run_events` aliased `e`: a stub's
# manifest, call or answer put back (server/events/manifests.py, calls.py, answers.py).
# Every read of the log whose data goes to a client uses it.
EVENT_DATA = f"""CASE {manifests.EVENT_DATA}
    {calls.EVENT_DATA}
    {answers.EVENT_DATA}
    ELSE e.data END"""


# `agentrt_run_events` reads the log's daily partitions of the run's lifetime only: its
# `created_at` and `updated_at`, with a day of margin for clock skew between hosts, bound
# `ts` as values its plan starts with (migration 0052, docs/decisions/2058).
READ_EVENTS = f"""
SELECT e.seq, e.type, e.ts, ({EVENT_DATA})::text AS data
FROM agentrt_run_events(%(run)s, %(after)s, NULL, %(limit)s) e
ORDER BY e.seq
"""


async def read_events(
    conn: Conn, run_id: str, after: int, limit: int
) -> list[tuple[int, str, str]]:
    """Return up to `limit` events after `after` as (seq, type, wire JSON), oldest first."""
    cur = await conn.execute(READ_EVENTS, {"run": run_id, "after": after, "limit": limit})
    return [
        (r["seq"], r["type"], encode_event(run_id, r["seq"], r["type"], r["ts"], r["data"]))
        for r in await cur.fetchall()
    ]
