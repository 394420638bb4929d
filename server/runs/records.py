"""The runs table: every write to a run's record outside the event log's fenced append.

A run is created here (with its user message and `run.created`), claimed and leased, flagged
for cancel or pause, fenced out after a lost lease, and given its output message. Reads hand
back a typed `Run`; every status filter is built from the sets in server/domain.py.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import AsyncCursor, sql
from psycopg.types.json import Jsonb

from graphs.events import EventType
from server.auth import Principal
from server.db.pool import Conn, Pool, pipelined_transaction, retry_deadlocks
from server.domain import (
    ACTIVE,
    COUNTED,
    IN_PROGRESS,
    TERMINAL,
    Run,
    RunStatus,
    in_phase,
    status_in,
)
from server.errors import (
    ConversationBusyError,
    RunFinishedError,
    RunNotFoundError,
    TooManyRunsError,
)
from server.events.channels import CANCEL_CHANNEL, PAUSE_CHANNEL, RUNS_CHANNEL, TICKET
from server.events.log import (
    SNAPSHOT_COLUMNS,
    TAIL_JSON,
    NewEvent,
    RunHead,
    append_creating,
    append_events,
    fold_tail,
    head_of,
    new_head,
    started_by_claim,
)
from server.events.store import creating_statement
from server.ids import new_id
from server.lifecycle import audit
from server.runs.conversations import get_conversation
from server.runs.idempotency import IdempotencyKey, find_response, remember_response
from server.runs.views import accepted_view

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewRun:
    """A user message that starts a run, and how to treat a busy conversation and the limits.

    Attributes:
        if_busy: What to do when the conversation already has a run in progress: `enqueue`
            (run after it), `reject` (ConversationBusyError), `interrupt` (cancel it first).
        user_limit: With the `reject` limit policy, the most runs a user may have queued or
            active; beyond it, TooManyRunsError. None queues without limit.
        model_source: Why this model was picked (server/usage/routing.py), kept in the event.
        agent: The agent profile's name and the exact version the run uses.
        after_s: Seconds before a worker may claim the run (None: at once).
    """

    conversation_id: str
    content: str
    model: str
    options: dict[str, Any]
    if_busy: str = "enqueue"
    user_limit: int | None = None
    model_source: str | None = None
    agent: tuple[str, int] = ("default", 0)
    after_s: float | None = None


async def create_run(
    pool: Pool,
    who: Principal,
    conversation_id: str,
    content: str,
    model: str,
    options: dict[str, Any],
    *,
    if_busy: str = "enqueue",
    user_limit: int | None = None,
    model_source: str | None = None,
    agent: tuple[str, int] = ("default", 0),
    after_s: float | None = None,
) -> Run:
    """Store the user message and a queued run with its `run.created` event, atomically.

    The arguments are those of `NewRun`.
    """
    new = NewRun(
        conversation_id, content, model, options, if_busy, user_limit, model_source, agent, after_s
    )

    async def insert(conn: Conn, _conversation: dict[str, Any]) -> Committed[Run]:
        return (await _insert_run(conn, who, new)).run

    return await _in_locked_conversation(pool, who, conversation_id, insert)


# Builds the run of a posted message from its conversation's row, inside the transaction
# that holds the row's lock (the run's agent and model may come from the conversation).
RunBuilder = Callable[[Conn, dict[str, Any]], Awaitable[NewRun]]


@dataclass(frozen=True)
class Accepted:
    """A posted message as the API answers it.

    Attributes:
        answer: The API's answer (`accepted_view`).
        replayed: It replays the answer to an earlier request with the same idempotency key
            (then nothing was created).
        created: The new run's first events as a notification carries them
            (server/events/carry.py), committed: a stream can start with them without a read.
            None for a replay.
    """

    answer: dict[str, Any]
    replayed: bool
    created: str | None


class PostClaimer(Protocol):
    """The worker of the process that posts: it may take the run a post creates.

    The post claims the run in its own transaction (`posted_claim_statement`), so that the
    run starts without a queued notification's hop and a claim's transaction of its own.
    """

    def reserve_post(self) -> str | None:
        """Hold a free slot for a post's run; its claim statement, None if no slot is free."""

    def release_post(self) -> None:
        """Give back the slot `reserve_post` held, once the post's claim is done."""

    def start_posted(self, claim: Claim) -> None:
        """Execute the run a post's claim took."""


@contextlib.asynccontextmanager
async def _slot(claimer: PostClaimer | None) -> AsyncIterator[str | None]:
    """A slot of `claimer` for the post's run, held until the block ends: its claim statement."""
    statement = None if claimer is None else claimer.reserve_post()
    try:
        yield statement
    finally:
        if statement is not None:
            assert claimer is not None
            claimer.release_post()


async def _claim_sent(conn: Conn, statement: str | None, run_id: str) -> AsyncCursor[Any] | None:
    """Send the post's claim of its run (unread), after its creating statement."""
    if statement is None:
        return None
    return await conn.execute(statement, {"run": run_id})


async def _start_claimed(
    conn: Conn, claimer: PostClaimer | None, cursor: AsyncCursor[Any] | None
) -> None:
    """Start the run the post's committed claim took, if it took it.

    A failure here leaves the run claimed and not started: its lease runs out and a worker
    takes it over, as after a crash; the post itself has succeeded.
    """
    if claimer is None or cursor is None:
        return
    try:
        row = await cursor.fetchone()
        assert row is not None  # the claim returns one row whether or not it claims
        claim = await claim_of(conn, row)
    except Exception:
        log.exception("a post's claim could not be started; its lease will run out")
        return
    if claim is not None:
        claimer.start_posted(claim)


async def accept_message(
    pool: Pool,
    who: Principal,
    conversation_id: str,
    build: RunBuilder,
    idempotency: IdempotencyKey | None = None,
    alongside: Callable[[Conn], Awaitable[None]] | None = None,
    claimer: PostClaimer | None = None,
) -> Accepted:
    """Create the run of a posted message; return the API's answer.

    With an idempotency key already used with the same body, nothing is created and the
    first answer is returned; the key is checked before the busy policy and the limits, so a
    retry is never refused because of the run the first attempt created.

    Args:
        pool: The pool.
        who: The caller.
        conversation_id: The conversation the message is posted to.
        build: The run to create, from the conversation's locked row; any error it raises
            (an unknown agent or model) leaves nothing stored.
        idempotency: The request's idempotency key, if any.
        alongside: Reads `build` will want, sent in the conversation lock's round trip
            (`get_conversation`); it keeps its own errors for `build` to raise.
        claimer: The process's worker, which may take the run in the post's transaction.

    Raises:
        ConversationNotFoundError: no such conversation for the caller's tenant.
        IdempotencyKeyReusedError: the key was used with a different body.
    """

    async def insert(
        conn: Conn, conversation: dict[str, Any], statement: str | None
    ) -> Committed[Accepted]:
        if idempotency is not None:
            earlier = await find_response(conn, conversation_id, idempotency)
            if earlier is not None:
                return functools.partial(_ready, Accepted(earlier, True, None))
        new = await build(conn, conversation)
        created = await _insert_run(conn, who, new, queued=statement is None)
        claimed = await _claim_sent(conn, statement, created.run_id)
        answer = _answer(created, new)
        if idempotency is not None:
            await remember_response(
                conn, who.tenant_id, conversation_id, idempotency, created.run_id, answer
            )

        async def committed() -> Accepted:
            accepted = Accepted(answer, False, (await created.row())["carried"])
            await _start_claimed(conn, claimer, claimed)
            return accepted

        return committed

    async def attempt() -> Accepted:
        async with _slot(claimer) as statement:
            return await _in_locked_conversation(
                pool,
                who,
                conversation_id,
                lambda conn, conversation: insert(conn, conversation, statement),
                alongside,
                retry=False,
            )

    return await retry_deadlocks(attempt)


EXPECTATION_SQLSTATE = "AR003"  # raised by agentrt_expect_post() (migration 0039)


@dataclass(frozen=True)
class Expected:
    """What a process remembers of a conversation, checked as its new run is stored.

    Attributes:
        agent: The conversation's `agent` column (its profile reference), as created.
        model: The conversation's `model` column, as created.
        agent_name: The profile the run uses (unpinned: its latest version).
        agent_version: That profile's latest version when it was last read.
    """

    agent: str | None
    model: str | None
    agent_name: str
    agent_version: int


async def accept_expected(
    pool: Pool,
    who: Principal,
    new: NewRun,
    expected: Expected,
    claimer: PostClaimer | None = None,
) -> Accepted | None:
    """Create `new` (built from what is remembered) in one round trip, if it still holds.

    `agentrt_expect_post()` goes out first, unread: it takes the conversation's lock and
    refuses when the conversation or the profile's latest version is not as `expected`, and
    the whole transaction rolls back. None then: nothing is stored, and the caller posts
    again with `accept_message`, which reads them. No idempotency key: its check reads.
    `claimer`: the process's worker, which may take the run in the same transaction.
    """

    async def attempt() -> Accepted | None:
        async with _slot(claimer) as statement, pool.connection() as conn:
            try:
                async with pipelined_transaction(conn):
                    await conn.execute(
                        "SELECT agentrt_expect_post(%s, %s, %s, %s, %s, %s)",
                        (
                            new.conversation_id,
                            who.tenant_id,
                            expected.agent,
                            expected.model,
                            expected.agent_name,
                            expected.agent_version,
                        ),
                    )
                    created = await _insert_run(conn, who, new, queued=statement is None)
                    claimed = await _claim_sent(conn, statement, created.run_id)
            except psycopg.Error as exc:
                if exc.sqlstate == EXPECTATION_SQLSTATE:
                    return None
                raise
            answer = _answer(created, new)
            accepted = Accepted(answer, False, (await created.row())["carried"])
            await _start_claimed(conn, claimer, claimed)
            return accepted

    return await retry_deadlocks(attempt)


def _answer(created: Created, new: NewRun) -> dict[str, Any]:
    """The API's answer for a run just created (its statements sent, their results unread)."""
    return accepted_view(
        created.run_id,
        created.head.status,
        new.conversation_id,
        created.message_id,
        new.model,
        new.agent,
        new.model_source,
    )


# What a transaction's body hands back: called once the transaction has committed, it reads
# the results the body left unread (they came with the COMMIT's round trip).
Committed = Callable[[], Awaitable[T]]


async def _ready(value: T) -> T:
    return value


async def _in_locked_conversation(
    pool: Pool,
    who: Principal,
    conversation_id: str,
    body: Callable[[Conn, dict[str, Any]], Awaitable[Committed[T]]],
    alongside: Callable[[Conn], Awaitable[None]] | None = None,
    *,
    retry: bool = True,
) -> T:
    """Run `body` in a transaction holding the conversation's row lock; retry on deadlock.

    `retry=False` leaves the retry to the caller, which does more around each attempt.

    `body` is given the conversation's row as locked. The conversation's lock is taken
    before any run's: one lock order (docs/decisions/1020). Pipelined: statements whose
    results nobody reads before the end (the message's and the run's INSERTs) go out with
    the `COMMIT`, in one round trip; `body`'s `Committed` reads them after it.
    """

    async def attempt() -> T:
        async with pool.connection() as conn:
            async with pipelined_transaction(conn):
                conversation = await get_conversation(
                    conn, who, conversation_id, lock=True, alongside=alongside
                )
                committed = await body(conn, conversation)
            return await committed()

    return await retry_deadlocks(attempt) if retry else await attempt()


# A new run's row, written at its first events' seq and status by the statement that appends
# them (`creating_statement`).
_CREATE = creating_statement("""
INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, options, input_message_id,
    principal_roles, agent_name, agent_version, not_before, status, last_event_seq)
VALUES (%(id)s, %(conversation_id)s, %(tenant_id)s, %(user_id)s, %(model)s, %(options)s,
    %(input_message_id)s, %(principal_roles)s, %(agent_name)s, %(agent_version)s,
    now() + make_interval(secs => %(after_s)s::float), %(status)s, %(seq)s)
RETURNING *
""")


@dataclass(frozen=True)
class Created:
    """A run whose statements are sent in the caller's transaction, their results unread.

    Attributes:
        run_id: The run.
        message_id: Its user message.
        head: Its head after `run.created`.
        cursor: The creating statement's; its row is read once the transaction committed.
    """

    run_id: str
    message_id: str
    head: RunHead
    cursor: AsyncCursor[Any]

    async def row(self) -> dict[str, Any]:
        """The run's row as inserted, with `carried` (`creating_statement`)."""
        row = await self.cursor.fetchone()
        assert row is not None  # the statement inserts the row or fails
        return dict(row)

    async def run(self) -> Run:
        """The run as inserted."""
        return Run.from_row(await self.row())


async def _insert_run(conn: Conn, who: Principal, new: NewRun, *, queued: bool = True) -> Created:
    """Apply the busy policy and limits; send the message's, run's and first event's inserts.

    The run and `run.created` go in one statement; no result is read here. `queued=False`
    holds back the queued notification, for a post whose claim sends it if it is still due.
    """
    message_id, run_id = new_id("msg"), new_id("run")
    await _apply_busy_policy(conn, who, new.conversation_id, new.if_busy)
    if new.user_limit is not None:
        await _refuse_over_limit(conn, who, new.user_limit)
    await conn.execute(
        "INSERT INTO messages (id, conversation_id, tenant_id, user_id, run_id, role, content)"
        " VALUES (%s, %s, %s, %s, %s, 'user', %s)",
        (message_id, new.conversation_id, who.tenant_id, who.user_id, run_id, new.content),
    )
    created = NewEvent(
        EventType.RUN_CREATED,
        {
            "conversationId": new.conversation_id,
            "model": new.model,
            "modelSource": new.model_source,
            "agent": f"{new.agent[0]}@{new.agent[1]}",
            "inputMessageId": message_id,
        },
    )
    values = {
        "conversation_id": new.conversation_id,
        "tenant_id": who.tenant_id,
        "user_id": who.user_id,
        "model": new.model,
        "options": Jsonb(new.options),
        "input_message_id": message_id,
        "principal_roles": sorted(who.roles),
        "agent_name": new.agent[0],
        "agent_version": new.agent[1],
        "after_s": new.after_s,
    }
    if not queued:
        values["queued"] = False
    head, cursor = await append_creating(conn, run_id, [created], _CREATE, values)
    return Created(run_id, message_id, head, cursor)


async def _apply_busy_policy(conn: Conn, who: Principal, conversation_id: str, policy: str) -> None:
    if policy == "enqueue":
        return
    cur = await conn.execute(
        f"SELECT id, status FROM runs WHERE conversation_id = %s AND {OPEN}"
        f" AND {status_in(IN_PROGRESS)} ORDER BY created_at, id FOR NO KEY UPDATE",
        (conversation_id,),
    )
    busy = await cur.fetchall()
    if not busy:
        return
    if policy == "reject":
        raise ConversationBusyError(conversation_id, busy[0]["id"], busy[0]["status"])
    for row in busy:
        await cancel_locked(conn, row["id"], RunStatus(row["status"]), who.user_id)


async def _refuse_over_limit(conn: Conn, who: Principal, limit: int) -> None:
    cur = await conn.execute(
        "SELECT count(*) AS n FROM runs WHERE tenant_id = %s AND user_id = %s"
        f" AND {status_in(COUNTED)}",
        (who.tenant_id, who.user_id),
    )
    row = await cur.fetchone()
    if row is not None and row["n"] >= limit:
        raise TooManyRunsError(limit, row["n"])


async def get_run(conn: Conn, who: Principal, run_id: str, *, lock: bool = False) -> Run:
    """Return the tenant's run (locked if `lock`) or raise RunNotFoundError."""
    cur = await conn.execute(
        "SELECT * FROM runs WHERE id = %s AND tenant_id = %s"
        + (" FOR NO KEY UPDATE" if lock else ""),
        (run_id, who.tenant_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise RunNotFoundError(run_id)
    return Run.from_row(row)


async def cancel_locked(conn: Conn, run_id: str, status: RunStatus, by: str) -> None:
    """Cancel a run whose row the caller holds locked (`SELECT … FOR NO KEY UPDATE`).

    A run no worker holds is cancelled here and now; a running one is flagged and its worker,
    wherever it runs, is told through NOTIFY (the heartbeat catches a missed notification).

    Raises:
        RunFinishedError: the run already ended.
    """
    reason = {"reason": "cancel requested", "by": by}
    if status in ACTIVE and await _leased(conn, run_id):
        await conn.execute(
            "UPDATE runs SET cancel_requested = true, updated_at = now() WHERE id = %s",
            (run_id,),
        )
        await conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, run_id))
    elif status in IN_PROGRESS:
        await append_events(conn, run_id, [NewEvent(EventType.RUN_CANCELLED, reason)])
        await conn.execute(
            "UPDATE approvals SET status = 'cancelled', decided_by = %s,"
            " decided_at = now(), decision_reason = 'the run was cancelled'"
            " WHERE run_id = %s AND status = 'pending'",
            (by, run_id),
        )
    else:
        raise RunFinishedError(run_id, status)
    await _cancel_children(conn, run_id, by)


async def request_cancel(pool: Pool, who: Principal, run_id: str) -> Run:
    """Cancel a run: at once when no worker holds it, else ask its worker to stop.

    A run waiting for approval is cancelled at once and its pending approvals are closed.

    Raises:
        RunNotFoundError: no such run for this tenant.
        RunFinishedError: the run already ended (the API answers 409).
    """

    async def attempt() -> Run:
        async with pool.connection() as conn:
            async with conn.transaction():
                run = await get_run(conn, who, run_id, lock=True)
                await cancel_locked(conn, run_id, run.status, who.user_id)
                await audit.record(
                    conn,
                    tenant_id=who.tenant_id,
                    actor=who.user_id,
                    action="run.cancel_requested",
                    target=run_id,
                    diff={"status": run.status.value},
                )
            return await get_run(conn, who, run_id)

    return await retry_deadlocks(attempt)


async def request_pause_flag(conn: Conn, run_id: str) -> None:
    """Ask the worker holding a run to pause it at its next step boundary (row locked)."""
    await conn.execute(
        "UPDATE runs SET pause_requested = true, updated_at = now() WHERE id = %s", (run_id,)
    )
    await conn.execute("SELECT pg_notify(%s, %s)", (PAUSE_CHANNEL, run_id))


async def mark_paused(conn: Conn, head: RunHead) -> None:
    """Record when the run was paused; pass as `extra` with the `run.paused` event."""
    await conn.execute(
        "UPDATE runs SET pause_requested = false, paused_at = now() WHERE id = %s",
        (head.run_id,),
    )


async def unpause(conn: Conn, run_id: str) -> None:
    """Push a paused run's deadline back by the time it spent paused (row locked)."""
    await conn.execute(
        "UPDATE runs SET deadline_at = deadline_at + (now() - paused_at), paused_at = NULL"
        " WHERE id = %s",
        (run_id,),
    )


# A run in progress has no `finished_at` (the append that ends it sets it): the test lets a
# read of a conversation's runs in progress use `runs_open_by_conversation` (docs/decisions/
# 2059), which holds none of its finished runs; the status is tested as well.
OPEN = "finished_at IS NULL"


# Fair across users: the queued run whose user has the fewest active runs goes first, then
# the oldest; a parent waiting for its children holds no worker, so it does not count. A
# conversation runs one run at a time, in order (docs/decisions/0007). Only users holding
# leases can have a count above zero, so the best run is the best of one candidate per such
# user and the oldest run of everyone else: index walks that stop at the first claimable
# run, whatever the queue's length (docs/decisions/1900).
_CLAIMABLE = f"""
      (r.not_before IS NULL OR r.not_before <= now())
      AND COALESCE(ta.n, 0) < COALESCE(
          (%(overrides)s::jsonb -> r.tenant_id ->> 'tenantMaxActiveRuns')::int, %(tenant_max)s)
      AND NOT EXISTS (
          SELECT 1 FROM runs o WHERE o.conversation_id = r.conversation_id AND o.{OPEN}
            AND ({status_in(IN_PROGRESS - {RunStatus.QUEUED}, "o.status")}
                 OR (o.status = '{RunStatus.QUEUED.value}' AND o.created_at < r.created_at)))
      AND %(only)s
"""
_STARTS = "NOT runs.cancel_requested AND NOT runs.pause_requested"
_USER_MAX = "COALESCE((%(overrides)s::jsonb -> {0} ->> 'userMaxActiveRuns')::int, %(user_max)s)"
_CLAIM = f"""
WITH user_active AS (
    SELECT tenant_id, user_id, count(*) AS n FROM runs
    WHERE {in_phase("active")} AND lease_owner IS NOT NULL GROUP BY tenant_id, user_id
), tenant_active AS (
    -- The tenants' counts are their users' added up: one scan of the active runs, not two.
    SELECT tenant_id, sum(n)::bigint AS n FROM user_active GROUP BY tenant_id
), held AS (
    SELECT c.id, ua.n, c.created_at FROM user_active ua CROSS JOIN LATERAL (
        SELECT r.id, r.created_at FROM runs r
        LEFT JOIN tenant_active ta ON ta.tenant_id = r.tenant_id
        WHERE {in_phase("queued", "r")}
          AND r.tenant_id = ua.tenant_id AND r.user_id = ua.user_id
          AND ua.n < {_USER_MAX.format("ua.tenant_id")}
          AND {_CLAIMABLE}
        ORDER BY r.created_at LIMIT 1
        FOR UPDATE OF r SKIP LOCKED
    ) c
), fresh AS (
    SELECT r.id, 0::bigint AS n, r.created_at FROM runs r
    LEFT JOIN tenant_active ta ON ta.tenant_id = r.tenant_id
    WHERE {in_phase("queued", "r")}
      AND NOT EXISTS (
          SELECT 1 FROM user_active ua
          WHERE ua.tenant_id = r.tenant_id AND ua.user_id = r.user_id)
      AND 0 < {_USER_MAX.format("r.tenant_id")}
      AND {_CLAIMABLE}
    ORDER BY r.created_at LIMIT 1
    FOR UPDATE OF r SKIP LOCKED
), next AS (
    -- The claim moves the lease generation on, so it must hold the run's fence lock
    -- exclusively: a candidate whose checkpoint write is still in flight (an attempt stopped
    -- mid-write) is passed over (docs/decisions/1980). OFFSET 0 keeps the filter above the
    -- sort, so the lock is tried on the candidates in order and only until one is taken.
    SELECT id FROM (
        SELECT * FROM held UNION ALL SELECT * FROM fresh ORDER BY n, created_at OFFSET 0
    ) c
    WHERE pg_try_advisory_xact_lock(7301, agentrt_fence_key(c.id))
    LIMIT 1
)
UPDATE runs SET
    lease_owner = %(owner)s,
    lease_generation = runs.lease_generation + 1,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    deadline_at = COALESCE(runs.deadline_at, now() + make_interval(
        secs => COALESCE((runs.options ->> 'timeoutSeconds')::float, %(timeout)s))),
    attempt = runs.attempt + 1,
    -- The run starts: its head moves over `run.started`, appended below (but for a run whose
    -- cancel or pause was asked while it was queued: the worker appends that instead).
    status = CASE WHEN {_STARTS} THEN '{RunStatus.RUNNING.value}' ELSE runs.status END,
    last_event_seq = runs.last_event_seq + CASE WHEN {_STARTS} THEN 1 ELSE 0 END,
    started_at = COALESCE(runs.started_at, CASE WHEN {_STARTS} THEN now() END),
    updated_at = now()
FROM next WHERE runs.id = next.id
RETURNING runs.*, {_STARTS} AS starts,
    (SELECT content FROM messages WHERE id = runs.input_message_id) AS input_content,
    -- What the attempt starts from, read here instead of in round trips of their own after
    -- the claim (docs/decisions/2056): the run's profile version, the tenant's tool
    -- configuration, and whether the run's thread has a checkpoint to read.
    (SELECT to_jsonb(p) FROM agent_profiles p WHERE p.tenant_id = runs.tenant_id
        AND p.name = runs.agent_name AND p.version = runs.agent_version) AS agent_profile,
    (SELECT config FROM tenant_tool_configs t WHERE t.tenant_id = runs.tenant_id)
        AS tool_config,
    EXISTS (SELECT FROM checkpoints c
            WHERE c.thread_id = runs.conversation_id AND c.checkpoint_ns = '') AS thread_stored
"""
# One row either way: the claimed run (all NULL when none) with its stored snapshot, its
# `run.started` as stored, and whether any other run is queued in the statement's snapshot
# (the run just claimed is still queued there). `run.started` is appended as any append does
# (the event, the notification carrying it), in the claim's statement: one update of the run's
# row and one round trip fewer (docs/decisions/2012). Its trace id is `hex_trace_id`'s.
_CLAIM_REPORTING = f"""
WITH claimed AS ({_CLAIM}), started AS (
    INSERT INTO run_events (run_id, seq, type, ts, attempt, data)
    SELECT id, last_event_seq, '{EventType.RUN_STARTED.value}', clock_timestamp(), attempt,
        jsonb_build_object('attempt', attempt, 'worker', %(owner)s, 'traceId',
            left(encode(sha256(convert_to('trace:' || id, 'UTF8')), 'hex'), 32))
    FROM claimed WHERE starts
    RETURNING run_id, seq, type, ts, data::text AS data
), woken AS (
    SELECT pg_notify(%(events_channel)s, run_id || ':' || seq || E'\\n'
        || to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || E'\\n'
        || seq || ' ' || type || ' ' || data)
    FROM started
)
SELECT claimed.*, {SNAPSHOT_COLUMNS}, {TAIL_JSON.format(run="claimed", after="s.seq")} AS tail,
    started.ts AS started_ts, started.data AS started_data,
    (SELECT count(*) FROM woken) AS woken, %(requeued)s AS requeued,
    EXISTS (
        SELECT 1 FROM runs q WHERE {in_phase("queued", "q")}
          AND q.id NOT IN (SELECT id FROM claimed)
    ) AS backlog
FROM (SELECT 1) AS one LEFT JOIN claimed ON true
LEFT JOIN run_snapshots s ON s.run_id = claimed.id
LEFT JOIN started ON true
"""


@dataclass(frozen=True)
class StartReads:
    """What a claimed run's attempt starts from, read by the claim's statement.

    Attributes:
        profile: The row of the profile version the run recorded (as `to_jsonb` gives it),
            None when no such row is stored (the built-in default has none).
        tool_config: The tenant's stored tool configuration, None when it has none.
        thread_stored: Whether the run's thread has a checkpoint (else its state is empty).
    """

    profile: dict[str, Any] | None
    tool_config: dict[str, Any] | None
    thread_stored: bool


@dataclass(frozen=True)
class Claim:
    """A run just claimed, with what its attempt starts from.

    Attributes:
        run: The run as the claim left it (new lease, generation and attempt).
        head: Its head for the next append, under the claim's row lock.
        input: The user message that started the run, read by the claim's statement.
        reads: Its profile, its tenant's tool configuration and whether its thread is
            stored, read by the claim's statement (docs/decisions/2056).
    """

    run: Run
    head: RunHead
    input: str
    reads: StartReads


async def claim_next(conn: Conn, params: Mapping[str, Any]) -> Claim | None:
    """Lease the next claimable run to `params["owner"]`, in the caller's transaction.

    Args:
        conn: A connection inside a transaction that holds the claim advisory lock.
        params: The claim's parameters (`server.runs.worker.claim_params`).
    """
    return (await claim_reporting_backlog(conn, claim_statement(params)))[0]


CLAIM_LOCK = 7_262_616_002  # the advisory lock that serialises claims (exact limits)


def claim_statement(params: Mapping[str, Any]) -> str:
    """The claim statement with `params` written in as SQL literals.

    They are the worker's own constants (its name, its settings), so the text is the same at
    every claim. A prepared statement without parameters is planned once per connection, with
    every value the planner would know at a claim, and kept until `runs` is analyzed again.
    With the values as parameters, Postgres planned the first five claims on each connection
    (about a millisecond each), and again after any rollback, then settled on a plan made
    without the values (docs/decisions/2003).
    """
    literals = {key: sql.Literal(value).as_string() for key, value in params.items()}
    return _CLAIM_REPORTING % {**literals, "only": "true", "requeued": "0"}


# What a post's claim adds to the claim's conditions: the run just posted, and only while no
# other run is queued (so it goes no earlier than a claim would take it), and only if no
# claim is under way (a post never waits for one: the run stays queued for the workers).
_POSTED_ONLY = f"""r.id = %(run)s
      AND NOT EXISTS (SELECT 1 FROM runs q WHERE {in_phase("queued", "q")} AND q.id <> %(run)s)
      AND pg_try_advisory_xact_lock({CLAIM_LOCK})"""
# A run a post's claim did not take is queued: the notification the post held back is sent.
_POSTED_REQUEUED = f"""(SELECT count(pg_notify('{RUNS_CHANNEL}', '{TICKET}' || %(run)s::text))
        WHERE NOT EXISTS (SELECT FROM claimed))"""


def posted_claim_statement(params: Mapping[str, Any]) -> str:
    """The claim a post makes for its process's worker, of the run it posts (`%(run)s`).

    The claim statement of `claim_statement` with two more conditions: the run is the one
    the post's transaction just inserted, and no other run is queued; and with the claim's
    lock taken only if it is free. The run's queued notification is sent only if the run was
    not claimed: the post sends its creating statement without it (docs/decisions/2054).
    """
    literals = {
        key: sql.Literal(value).as_string().replace("%", "%%") for key, value in params.items()
    }
    return _CLAIM_REPORTING % {**literals, "only": _POSTED_ONLY, "requeued": _POSTED_REQUEUED}


async def claim_reporting_backlog(conn: Conn, statement: str) -> tuple[Claim | None, bool]:
    """Claim like `claim_next`, and say whether any other run was queued (claimable or not).

    `statement` is `claim_statement` of the claim's parameters: a worker writes it once. A
    worker that is told there was none need not claim again until a run is queued: the
    queued notification says when.
    """
    cur = await conn.execute(statement)
    row = await cur.fetchone()
    assert row is not None  # the statement returns one row whether or not it claims
    return await claim_of(conn, row), row["backlog"]


async def claim_of(conn: Conn, row: Mapping[str, Any]) -> Claim | None:
    """The claim of a claim statement's row, None if it claimed nothing.

    `conn` is the claim's transaction, or the pool's connection once a post's claim has
    committed: the head of a run just created needs no statement (`started_by_claim`).
    """
    if row["id"] is None:
        return None
    run = Run.from_row(row)
    if row["started_data"] is None:  # a cancel or pause asked for: not started
        # The stored snapshot lags behind a new run's first events (it has none) and behind a
        # worker that lost the run: the claim's statement read them (docs/decisions/2010, 2044).
        head = await fold_tail(conn, head_of(run.id, row), row["tail"] or ())
    else:
        head = await started_by_claim(conn, row, row["started_ts"], row["started_data"])
    reads = StartReads(row["agent_profile"], row["tool_config"], bool(row["thread_stored"]))
    return Claim(run, head, row["input_content"], reads)


async def renew_leases(
    conn: Conn, owner: str, run_ids: list[str], lease_s: float
) -> list[dict[str, Any]]:
    """Extend `owner`'s leases; return `id, cancel_requested, pause_requested` of those kept."""
    cur = await conn.execute(
        "UPDATE runs SET lease_expires_at = now() + make_interval(secs => %(lease)s)"
        f" WHERE id = ANY(%(ids)s) AND lease_owner = %(owner)s AND {status_in(ACTIVE)}"
        " RETURNING id, cancel_requested, pause_requested",
        {"lease": lease_s, "owner": owner, "ids": run_ids},
    )
    return await cur.fetchall()


# Only the runs a worker holds (`runs_held`): a parent waiting for its children is active but
# holds no lease, and there may be many of them.
_EXPIRED_LEASES = (
    f"SELECT id, recoveries FROM runs WHERE {in_phase('active')} AND lease_owner IS NOT NULL"
    " AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED"
)


async def lock_expired_leases(conn: Conn, limit: int = 100) -> list[dict[str, Any]]:
    """Lock and return `id, recoveries` of active runs whose lease ran out, oldest first.

    Each run returned is also held by its checkpoint fence's lock (migration 0034) until the
    transaction ends; a run whose fenced checkpoint write is in flight is left for a later
    pass, so that `fence_out` can never overtake a write that already passed the fence.
    """
    cur = await conn.execute(_EXPIRED_LEASES, (limit,))
    expired = await cur.fetchall()
    if not expired:
        return expired
    cur = await conn.execute(
        "SELECT id FROM unnest(%s::text[]) AS id"
        " WHERE pg_try_advisory_xact_lock(7301, agentrt_fence_key(id))",
        ([r["id"] for r in expired],),
    )
    fenced = {r["id"] for r in await cur.fetchall()}
    return [r for r in expired if r["id"] in fenced]


async def fence_out(conn: Conn, run_id: str, recoveries: int) -> None:
    """Count a recovery and start a new lease generation, fencing out the lost attempt.

    Its worker may still be alive (it only lost touch with the database) and must write no
    more events or checkpoints for this run. The caller holds the run's fence lock
    (`lock_expired_leases`), so no checkpoint write is between its fence and its commit.
    """
    await conn.execute(
        "UPDATE runs SET recoveries = %s, lease_generation = lease_generation + 1 WHERE id = %s",
        (recoveries, run_id),
    )


# Subagents (docs/subagents.md): child runs are created, cancelled and retried here too.


async def _leased(conn: Conn, run_id: str) -> bool:
    """Say whether a worker holds the run (a parent waiting for children is held by none)."""
    cur = await conn.execute("SELECT lease_owner FROM runs WHERE id = %s", (run_id,))
    row = await cur.fetchone()
    return row is not None and row["lease_owner"] is not None


async def _cancel_children(conn: Conn, run_id: str, by: str) -> None:
    """Cancel the run's unfinished child runs (and theirs), parent row locked before child."""
    cur = await conn.execute(
        f"SELECT id, status FROM runs WHERE parent_run_id = %s AND {status_in(IN_PROGRESS)}"
        " ORDER BY created_at, id FOR NO KEY UPDATE",
        (run_id,),
    )
    for row in await cur.fetchall():
        await cancel_locked(conn, row["id"], RunStatus(row["status"]), by)


@dataclass(frozen=True)
class NewChildRun:
    """A child run a parent's delegation starts, in a conversation of its own.

    Attributes:
        parent: The delegating run (its row locked by the caller's append).
        content: The child's task, as its user message.
        model: The child's model.
        options: The child's run options (tools, budget share, deadline).
        agent: The child's profile name and exact version.
        tool_call_id: The parent's `delegate` call the child answers.
        run_id: The child's id, chosen first so the parent's events can name it.
    """

    parent: Run
    content: str
    model: str
    options: dict[str, Any]
    agent: tuple[str, int]
    tool_call_id: str
    run_id: str = field(default_factory=lambda: new_id("run"))


async def insert_child_run(conn: Conn, new: NewChildRun) -> Run:
    """Insert a child run, its conversation and user message, and `run.created`, atomically.

    Runs in the caller's transaction (the parent's suspension or a retry).
    """
    parent = new.parent
    conversation_id, message_id, run_id = new_id("conv"), new_id("msg"), new.run_id
    await conn.execute(
        "INSERT INTO conversations (id, tenant_id, user_id, title, model, metadata, agent)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (
            conversation_id,
            parent.tenant_id,
            parent.user_id,
            f"subagent of {parent.id}",
            new.model,
            Jsonb({"parentRunId": parent.id, "toolCallId": new.tool_call_id}),
            new.agent[0],
        ),
    )
    await conn.execute(
        "INSERT INTO messages (id, conversation_id, tenant_id, user_id, run_id, role, content)"
        " VALUES (%s, %s, %s, %s, %s, 'user', %s)",
        (message_id, conversation_id, parent.tenant_id, parent.user_id, run_id, new.content),
    )
    await conn.execute(
        "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, options,"
        " input_message_id, principal_roles, agent_name, agent_version, parent_run_id, depth)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            run_id,
            conversation_id,
            parent.tenant_id,
            parent.user_id,
            new.model,
            Jsonb(new.options),
            message_id,
            list(parent.principal_roles),
            *new.agent,
            parent.id,
            parent.depth + 1,
        ),
    )
    created = NewEvent(
        EventType.RUN_CREATED,
        {
            "conversationId": conversation_id,
            "model": new.model,
            "modelSource": "parent",
            "agent": f"{new.agent[0]}@{new.agent[1]}",
            "inputMessageId": message_id,
        },
    )
    await append_events(conn, run_id, head=new_head(run_id), events=[created])
    cur = await conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,))
    row = await cur.fetchone()
    assert row is not None
    return Run.from_row(row)


async def cancel_children(pool: Pool, run_id: str, by: str) -> None:
    """Cancel the unfinished children of a run that ended (its row locked first)."""

    async def attempt() -> None:
        async with pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT 1 FROM runs WHERE id = %s FOR NO KEY UPDATE", (run_id,))
            await _cancel_children(conn, run_id, by)

    await retry_deadlocks(attempt)


async def delete_runs(
    conn: Conn, tenant_id: str, *, conversation_id: str | None = None, user_id: str | None = None
) -> int:
    """Delete the runs of a conversation, or of a user, for an erasure; return how many.

    Rows that reference a run go with it (foreign keys cascade); the erasure deletes the large
    ones (events, spans) itself first, table by table.
    """
    assert (conversation_id is None) != (user_id is None)
    cur = await conn.execute(
        "DELETE FROM runs WHERE tenant_id = %s AND "
        + ("conversation_id = %s" if conversation_id is not None else "user_id = %s"),
        (tenant_id, conversation_id if conversation_id is not None else user_id),
    )
    return cur.rowcount


async def mark_events_expired(conn: Conn, run_ids: list[str]) -> None:
    """Record that the retention dropped these runs' event logs (their records stay)."""
    await conn.execute(
        "UPDATE runs SET events_expired_at = now() WHERE id = ANY(%s)"
        " AND events_expired_at IS NULL",
        (run_ids,),
    )


async def delete_finished_run(conn: Conn, run_id: str) -> None:
    """Delete a finished run's record and its events (the LangGraph API's run delete)."""
    await conn.execute(
        f"DELETE FROM run_events WHERE run_id = %s AND EXISTS (SELECT 1 FROM runs"
        f" WHERE id = %s AND {status_in(TERMINAL)})",
        (run_id, run_id),
    )
    await conn.execute(f"DELETE FROM runs WHERE id = %s AND {status_in(TERMINAL)}", (run_id,))
