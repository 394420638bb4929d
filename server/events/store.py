"""How a batch reaches the log: one statement, one pipelined transaction, or COPY.

Each path moves the run's head under the conditional update that fences and serialises the
run's appenders, stores the events, writes the rows store hooks derive from them, and
notifies listeners, all or nothing (docs/decisions/0605, 1960).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncCursor, Error
from psycopg.pq import PipelineStatus, TransactionStatus

from graphs.events import EventType
from server.db.pool import Conn, pipelined_transaction
from server.events import manifests
from server.events.carry import NOTIFY_LIMIT_SQL
from server.events.channels import EVENTS_CHANNEL, RUNS_CHANNEL, TICKET

# Larger batches (a token burst) go through COPY, faster per row than a statement's arrays.
STATEMENT_MAX = 64
# While a run's status stays, appends move its row's `updated_at` at most this often.
UPDATED_EVERY_S = 60
# Raised by an append sent unread that moved no run head (`agentrt_appended`, migration 0038).
NOT_APPENDED_SQLSTATE = "AR002"


def not_appended(exc: BaseException) -> bool:
    """Say whether `exc` is an unread append's refusal: the run's head was not the appender's."""
    return isinstance(exc, Error) and exc.sqlstate == NOT_APPENDED_SQLSTATE


@dataclass
class StoredEvent:
    """An event as it is in the log and on the wire."""

    run_id: str
    seq: int
    type: EventType
    ts: datetime
    data: Mapping[str, Any]


@dataclass(frozen=True)
class StoreHook:
    """Rows kept beside the log: written with the events of `types`, in their transaction.

    The log knows nothing of those rows; the appender (a worker storing `usage` events, whose
    model-call rows the usage ledger writes) hands the hook in.
    """

    types: frozenset[EventType]
    store: Callable[[AsyncCursor[Any], str, Sequence[StoredEvent]], Awaitable[None]]


_MOVE = f"""
UPDATE runs SET
    last_event_seq = %(seq)s, status = %(status)s,
    -- Moved by a change of status, and otherwise at most once a minute: an append that only
    -- moves the head then changes one column, and its row version's WAL record holds little
    -- more than that column (docs/decisions/2015).
    updated_at = CASE WHEN status <> %(status)s OR %(terminal)s
        OR updated_at < now() - interval '{UPDATED_EVERY_S} seconds' THEN now()
        ELSE updated_at END,
    started_at = COALESCE(started_at, CASE WHEN %(status)s = 'running' THEN now() END),
    finished_at = CASE WHEN %(terminal)s AND NOT %(after_end)s THEN now() ELSE finished_at END,
    error_type = COALESCE(%(error_type)s, error_type),
    error_message = COALESCE(%(error_message)s, error_message),
    error_details = COALESCE(%(error_details)s, error_details),
    output_message_id = COALESCE(%(output_message_id)s, output_message_id),
    usage = COALESCE(%(usage)s, usage),
    lease_owner = CASE WHEN %(release)s THEN NULL ELSE lease_owner END,
    lease_expires_at = CASE WHEN %(release)s THEN NULL ELSE lease_expires_at END,
    deadline_at = CASE WHEN %(status)s = 'waiting_user' THEN NULL ELSE deadline_at END
WHERE id = %(id)s AND last_event_seq = %(prev)s
  AND (%(generation)s::bigint IS NULL OR lease_generation = %(generation)s)
RETURNING id, tenant_id
"""
# The run's snapshot, when the append stores it (docs/decisions/2010), as its JSON text
# (docs/decisions/2049); a row stored before as `jsonb` is written again as text.
KEEP_SNAPSHOT = """
INSERT INTO run_snapshots (run_id, seq, snapshot_text) VALUES (%(id)s, %(seq)s, %(snapshot)s::json)
ON CONFLICT (run_id) DO UPDATE
    SET seq = EXCLUDED.seq, snapshot = NULL, snapshot_text = EXCLUDED.snapshot_text
"""


# The batch's rows: a manifest kept in its table comes as its JSON text, parsed here once, and
# as the text the table keeps (`kept`: without the keys its columns hold; when absent, the
# whole text; server/events/manifests.py); an event whose call is kept in its ledger row, or
# whose answer its message keeps, comes whole as `whole`, for the notification
# (server/events/calls.py, answers.py).
_BATCH = """
    SELECT b.seq, b.type, b.data, b.manifest::jsonb AS manifest,
        COALESCE(b.kept, b.manifest) AS manifest_text, b.whole
    FROM jsonb_to_recordset(%(events)s::jsonb)
        AS b(seq bigint, type text, data jsonb, manifest text, kept text, whole jsonb)"""


# A small batch in one statement, atomic even outside a transaction: move the run's head if
# nobody else has (fencing and serialising appenders: `moved`); store the snapshot if it is to
# be, by an update of the run's row or an insert when it has none (not `ON CONFLICT`, whose
# speculative insert writes a second WAL record and whose update locks the row first; only the
# appender that moved the head writes it); store the events and the manifests kept beside
# them (server/events/manifests.py); notify listeners with the batch as a read of the log
# returns it (server/events/carry.py: jsonb's text of each event's data, whole where the log
# keeps a stub: server/events/calls.py, answers.py), or a pointer if it would not fit; and
# the workers, when the run is queued.
#
# The snapshot's, the manifests' and the workers' parts are in the statement only when the
# batch has them to write (`Parts`): Postgres sets up every part of a statement at each
# execution, those that write no row included (docs/decisions/2057).
def _append_sql(moved: str, result: str, parts: Parts) -> str:
    ctes = [f"moved AS ({moved})"]
    if parts.snapshot:
        ctes.append("""renewed AS (
    UPDATE run_snapshots s SET seq = %(seq)s, snapshot = NULL, snapshot_text = %(snapshot)s::json
    FROM moved WHERE s.run_id = moved.id
    RETURNING s.run_id
), kept AS (
    INSERT INTO run_snapshots (run_id, seq, snapshot_text)
    SELECT moved.id, %(seq)s, %(snapshot)s::json FROM moved
    WHERE NOT EXISTS (SELECT FROM renewed)
)""")
    ctes.append(f"""batch AS ({_BATCH}
), stored AS (
    INSERT INTO run_events (run_id, seq, type, ts, attempt, data)
    SELECT moved.id, b.seq, b.type, %(ts)s, %(attempt)s, b.data FROM moved, batch b
)""")
    if parts.manifests:
        insert = manifests.insert_sql("moved, batch b", "true", "moved.id", "moved.tenant_id")
        ctes.append(f"manifests AS ({insert})")
    queued = f"""
    UNION ALL
    SELECT pg_notify(%(runs_channel)s, '{TICKET}' || moved.id) FROM moved WHERE %(queued)s"""
    ctes.append(f"""carried AS (
    SELECT %(carried)s || string_agg(
            b.seq || ' ' || b.type || ' ' || COALESCE(b.manifest, b.whole, b.data)::text,
            E'\\n' ORDER BY b.seq) AS payload
    FROM batch b WHERE EXISTS (SELECT FROM moved)
), woken AS (
    SELECT pg_notify(%(events_channel)s, CASE
        WHEN octet_length(carried.payload) < {NOTIFY_LIMIT_SQL} THEN carried.payload
        ELSE %(payload)s END)
    FROM moved, carried{queued if parts.queued else ""}
)""")
    return "WITH " + ", ".join(ctes) + "\n" + result + "\n"


@dataclass(frozen=True)
class Parts:
    """Which of an append statement's optional parts a batch needs.

    Attributes:
        snapshot: The run's snapshot is stored (`%(snapshot)s` is not NULL).
        manifests: Some event of the batch has a manifest kept in its table.
        queued: The run is queued: the workers are notified.
    """

    snapshot: bool
    manifests: bool
    queued: bool

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Parts:
        """The parts a batch's parameters (`server/events/log.py` `_params`) need."""
        return cls(params["snapshot"] is not None, params["manifests"], params["queued"])


_MOVED = "SELECT (SELECT count(*) FROM moved) AS moved, (SELECT count(*) FROM woken) AS woken"
# For a caller that does not read the result: an append that moved no head raises
# (`NOT_APPENDED_SQLSTATE`), and the caller's transaction rolls back whole.
_RAISING = (
    "SELECT agentrt_appended((SELECT count(*) FROM moved), %(id)s, (SELECT count(*) FROM woken))"
)


@functools.cache
def _append(parts: Parts, unread: bool) -> str:
    """The append statement with `parts`; `unread`: the one that raises instead (`_RAISING`)."""
    return _append_sql(_MOVE, _RAISING if unread else _MOVED, parts)


# The manifests of a batch stored by COPY, in its transaction.
_COPIED_MANIFESTS = manifests.insert_sql(
    f"runs r, ({_BATCH}) b",
    "r.id = %(id)s",
    "r.id",
    "r.tenant_id",
)


def creating_statement(insert: str) -> str:
    """The statement that inserts a new run's row and appends its first events.

    `insert` is an `INSERT INTO runs … RETURNING *` writing the row at the events' last seq
    (`%(seq)s`) and status (`%(status)s`): no appender can come before the row exists, so
    the insert takes the place of the head's conditional update, and the run's row has one
    version where an insert and an update made two (docs/decisions/2011). The statement's
    one row is the run's, with `carried`: the notification's text of the events, whether or
    not it fit in the notification. It stores no snapshot and no manifest (a run's first
    events have none: `server/events/log.py` `append_creating`); it notifies the workers if
    `%(queued)s`.
    """
    return _append_sql(
        insert,
        "SELECT moved.*, carried.payload AS carried, (SELECT count(*) FROM woken) AS woken"
        " FROM moved, carried",
        _CREATING,
    )


_CREATING = Parts(snapshot=False, manifests=False, queued=True)


async def store_batch(
    conn: Conn,
    params: dict[str, Any],
    stored: list[StoredEvent],
    hooked: list[tuple[StoreHook, list[StoredEvent]]],
) -> bool:
    """Store a folded batch by the cheapest path; return False if the run's head had moved.

    On a pipelined connection nothing is read, so nothing waits for a round trip of its own
    and True is returned: an append that did not move the head raises at the caller's sync
    instead (`not_appended`), rolling back the caller's transaction with it.

    Args:
        conn: A connection from the pool (autocommit), or one inside the caller's transaction
            (a pipelined one's included: its explicit transaction, or the implicit one up to
            the pipeline's sync, such as a checkpoint write's).
        params: The statements' parameters (`server/events/log.py` `_params`).
        stored: The batch's events with their seq values.
        hooked: Each store hook with the batch's events it writes rows for.
    """
    # In a pipeline, libpq says idle until the sync: the pipeline's transaction holds us.
    pipelined = conn.info.pipeline_status != PipelineStatus.OFF
    if len(stored) > STATEMENT_MAX:
        if pipelined:
            raise ValueError(f"at most {STATEMENT_MAX} events go in the caller's pipeline")
        return await _append_by_copy(conn, params, stored, hooked)
    if pipelined:
        await _send_unread(conn, params, hooked)
        return True
    if not hooked:
        return await _append_statement(conn, params)
    if conn.info.transaction_status == TransactionStatus.IDLE:
        return await _append_pipelined(conn, params, hooked)
    # In the caller's transaction, which a lost fence rolls back whole.
    moved = await _append_statement(conn, params)
    if moved:
        await _store_hooked(conn, params["id"], hooked)
    return moved


async def _append_statement(conn: Conn, params: dict[str, Any]) -> bool:
    cur = await conn.execute(_append(Parts.of(params), unread=False), params)
    row = await cur.fetchone()
    return row is not None and row["moved"] == 1


async def _store_hooked(
    conn: Conn, run_id: str, hooked: list[tuple[StoreHook, list[StoredEvent]]]
) -> None:
    async with conn.cursor() as cur:
        for hook, found in hooked:
            await hook.store(cur, run_id, found)


async def _send_unread(
    conn: Conn, params: dict[str, Any], hooked: list[tuple[StoreHook, list[StoredEvent]]]
) -> None:
    """Send the append and its hooks' rows into the pipeline's transaction, reading nothing.

    The hooks' rows go out whether or not the head moves: if it does not, the append raises
    and the transaction, the rows included, rolls back.
    """
    await conn.execute(_append(Parts.of(params), unread=True), params)
    if hooked:
        await _store_hooked(conn, params["id"], hooked)


async def _append_pipelined(
    conn: Conn, params: dict[str, Any], hooked: list[tuple[StoreHook, list[StoredEvent]]]
) -> bool:
    """Append a small batch and its hooks' rows in one transaction, in one round trip.

    BEGIN, the append, the hooks' statements and COMMIT go out together. An append that did
    not move the run's head raises there, and nothing is stored.
    """
    try:
        async with pipelined_transaction(conn):
            await _send_unread(conn, params, hooked)
    except Error as exc:
        if not_appended(exc):
            return False
        raise
    return True


async def _append_by_copy(
    conn: Conn,
    params: dict[str, Any],
    stored: list[StoredEvent],
    hooked: list[tuple[StoreHook, list[StoredEvent]]],
) -> bool:
    # Followers read a burst back from the log: the pointer payload (docs/decisions/1960).
    async with conn.transaction(), conn.cursor() as cur:
        await cur.execute(_MOVE, params)
        if cur.rowcount != 1:
            return False
        if params["snapshot"] is not None:
            await cur.execute(KEEP_SNAPSHOT, params)
        # The conditional update above both fences and serialises appenders, so the seq values
        # below are ours alone.
        async with cur.copy(
            "COPY run_events (run_id, seq, type, ts, attempt, data) FROM STDIN"
        ) as copy:
            for ev, data in zip(stored, params["stored_datas"], strict=True):
                await copy.write_row(
                    (ev.run_id, ev.seq, str(ev.type), ev.ts, params["attempt"], data)
                )
        if params["manifests"]:
            await cur.execute(_COPIED_MANIFESTS, params)
        for hook, found in hooked:
            await hook.store(cur, params["id"], found)
        await cur.execute("SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, params["payload"]))
        if params["queued"]:
            await cur.execute("SELECT pg_notify(%s, %s)", (RUNS_CHANNEL, TICKET + params["id"]))
    return True
