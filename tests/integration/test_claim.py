"""The claim hands a queued run to a worker: the typed run, its head and its input message.

A module of its own, so the run it creates is the only one in its database.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import AsyncConnection

from server.auth import Principal
from server.db.pool import Pool
from server.events.carry import carried, run_of
from server.events.channels import EVENTS_CHANNEL
from server.events.log import load_head, read_events
from server.observability.tracing import hex_trace_id
from server.runs.conversations import create_conversation
from server.runs.records import (
    CLAIM_LOCK,
    Claim,
    claim_next,
    claim_reporting_backlog,
    claim_statement,
    create_run,
    get_run,
)
from server.runs.worker import claim_params
from server.settings import Settings

WHO = Principal("t1", "u1")


async def test_a_claim_leases_the_run_and_carries_its_input_message(
    pool: Pool, settings: Settings
) -> None:
    conv = await create_conversation(pool, WHO, None, None, {})
    created = await create_run(pool, WHO, conv["id"], "what time is it?", "demo", {})
    async with pool.connection() as conn, conn.transaction():
        claim = await claim_next(conn, claim_params(settings, "test-worker"))
    assert claim is not None
    assert claim.run.id == created.id
    assert claim.input == "what time is it?"
    assert claim.run.lease_owner == "test-worker"
    assert (claim.run.attempt, claim.run.lease_generation) == (1, 1)
    # The claim appended `run.started`: the head is after it.
    assert (claim.head.seq, claim.head.generation) == (created.last_event_seq + 1, 1)
    assert (claim.head.status, claim.run.status) == ("running", "running")
    assert claim.run.deadline_at is not None


async def test_a_claim_says_whether_another_run_is_still_queued(
    pool: Pool, settings: Settings
) -> None:
    params = claim_params(settings, "test-worker")
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("UPDATE runs SET status = 'completed' WHERE status = 'queued'")
        assert await claim_reporting_backlog(conn, claim_statement(params)) == (None, False)

    first = await create_conversation(pool, WHO, None, None, {})
    await create_run(pool, WHO, first["id"], "one", "demo", {})
    await create_run(pool, WHO, first["id"], "two, behind one", "demo", {})
    async with pool.connection() as conn, conn.transaction():
        claim, backlog = await claim_reporting_backlog(conn, claim_statement(params))
        assert claim is not None  # and started: no longer queued
    assert claim.input == "one"
    assert backlog, "the run behind it in its conversation is still queued"
    async with pool.connection() as conn, conn.transaction():
        # Queued but not claimable until "one" ends: still a backlog to look at later.
        assert await claim_reporting_backlog(conn, claim_statement(params)) == (None, True)

    second = await create_conversation(pool, WHO, None, None, {})
    await create_run(pool, WHO, second["id"], "alone", "demo", {})
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "UPDATE runs SET status = 'completed' WHERE input_message_id IN"
            " (SELECT id FROM messages WHERE content = 'two, behind one')"
        )
        claim, backlog = await claim_reporting_backlog(conn, claim_statement(params))
    assert claim is not None and claim.input == "alone"
    assert not backlog, "the run just claimed is not a backlog of its own"


async def test_a_run_whose_checkpoint_write_is_in_flight_is_claimed_after_the_write(
    pool: Pool, settings: Settings
) -> None:
    params = claim_params(settings, "test-worker")
    async with pool.connection() as conn:
        await conn.execute("UPDATE runs SET status = 'completed' WHERE status = 'queued'")
    conv = await create_conversation(pool, WHO, None, None, {})
    run = await create_run(pool, WHO, conv["id"], "a", "demo", {})
    # An attempt stopped while a checkpoint write of the run was between fence and commit.
    writing = await pool.getconn()
    try:
        await writing.execute("BEGIN")
        await writing.execute("SELECT agentrt_fence(%s, %s)", (run.id, run.lease_generation))
        async with pool.connection() as conn, conn.transaction():
            claim, backlog = await claim_reporting_backlog(conn, claim_statement(params))
        assert claim is None, "a takeover must not overtake a write that passed the fence"
        assert backlog, "the run is still queued: the worker will look again"
    finally:
        await writing.execute("COMMIT")
        await pool.putconn(writing)
    async with pool.connection() as conn, conn.transaction():
        claim = await claim_next(conn, params)
    assert claim is not None and claim.run.id == run.id
    assert claim.run.lease_generation == run.lease_generation + 1


async def _claim_on(conn: AsyncConnection[Any], params: dict[str, Any]) -> Claim | None:
    """One claim as the worker makes it: its own transaction, under the claim lock."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK,))
        return await claim_next(conn, params)


async def test_a_worker_plans_its_claim_once_per_connection(pool: Pool, settings: Settings) -> None:
    params = claim_params(settings, "test-worker-planned")  # a statement of its own
    async with pool.connection() as conn:
        await conn.execute("UPDATE runs SET status = 'completed' WHERE status = 'queued'")
    for n in range(3):
        conv = await create_conversation(pool, WHO, None, None, {})
        await create_run(pool, WHO, conv["id"], f"run {n}", "demo", {})
    conn = await pool.getconn()
    try:
        claimed = [await _claim_on(conn, params) for _ in range(6)]
        cur = await conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE position(%s in statement) > 0",
            ("test-worker-planned",),
        )
        plans = await cur.fetchall()
    finally:
        await pool.putconn(conn)
    assert [c is not None for c in claimed] == [True] * 3 + [False] * 3
    # One prepared statement for all six claims, served from its one plan: none was planned
    # again for its parameters.
    assert [(p["generic_plans"], p["custom_plans"]) for p in plans] == [(6, 0)]


async def test_the_claim_holds_quotes_in_its_values_as_literals(
    pool: Pool, settings: Settings
) -> None:
    async with pool.connection() as conn:
        await conn.execute("UPDATE runs SET status = 'completed' WHERE status = 'queued'")
    # A tenant whose limit is 0 comes first in the queue: the claim must pass it over.
    quoted = Principal("it's", "u1")
    held_back = await create_run(
        pool,
        quoted,
        (await create_conversation(pool, quoted, None, None, {}))["id"],
        "a",
        "demo",
        {},
    )
    other = await create_run(
        pool, WHO, (await create_conversation(pool, WHO, None, None, {}))["id"], "b", "demo", {}
    )
    limited = settings.model_copy(update={"tenant_limits": {"it's": {"tenantMaxActiveRuns": 0}}})
    params = claim_params(limited, "worker's-host:1")
    async with pool.connection() as conn:
        claim = await _claim_on(conn, params)
        assert claim is not None and claim.run.id == other.id
        assert claim.run.lease_owner == "worker's-host:1"
        assert await _claim_on(conn, params) is None
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT status FROM runs WHERE id = %s", (held_back.id,))
        assert await cur.fetchone() == {"status": "queued"}


async def test_the_claim_stores_run_started_as_its_append_would(
    pool: Pool, settings: Settings, database_url: str
) -> None:
    """The event, the row's head, status and start time, and a notification carrying the
    event byte for byte as a replay reads it."""
    async with pool.connection() as conn:
        # Earlier tests' runs hold leases for this user: end them all.
        await conn.execute("UPDATE runs SET status = 'completed', lease_owner = NULL")
    conv = await create_conversation(pool, WHO, None, None, {})
    created = await create_run(pool, WHO, conv["id"], "start me", "demo", {})
    async with await AsyncConnection.connect(database_url, autocommit=True) as listener:
        await listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        async with pool.connection() as conn, conn.transaction():
            claim = await claim_next(conn, claim_params(settings, "test-worker"))
        assert claim is not None and claim.run.id == created.id
        payloads = [
            n.payload
            async for n in listener.notifies(timeout=30, stop_after=1)
            if run_of(n.payload) == created.id
        ]
    async with pool.connection() as conn:
        events = await read_events(conn, created.id, 0, 10)
        head = await load_head(conn, created.id, lock=False)
        run = await get_run(conn, WHO, created.id)
    assert [kind for _, kind, _ in events] == ["run.created", "run.started"]
    assert json.loads(events[1][2])["data"] == {
        "attempt": 1,
        "worker": "test-worker",
        "traceId": hex_trace_id(created.id),
    }
    batch = carried(payloads[0])
    assert batch is not None and batch.events == events[1:]
    assert (head.seq, head.status, head.attempt) == (2, "running", 1)
    # The same fold as a reader's, which reads the log by a query of its own.
    assert head.snapshot == claim.head.snapshot
    # No snapshot stored yet: the claim's statement read `run.created` with the run's row.
    assert (claim.head.seq, claim.head.snapshot_seq) == (2, 0)  # held: stored when released
    assert (run.last_event_seq, run.status) == (2, "running")
    assert run.started_at is not None


async def test_a_run_asked_to_cancel_while_queued_is_claimed_but_not_started(
    pool: Pool, settings: Settings
) -> None:
    """Its worker appends `run.cancelled` in the claim's transaction instead."""
    async with pool.connection() as conn:
        # Earlier tests' runs hold leases for this user: end them all.
        await conn.execute("UPDATE runs SET status = 'completed', lease_owner = NULL")
    conv = await create_conversation(pool, WHO, None, None, {})
    created = await create_run(pool, WHO, conv["id"], "never mind", "demo", {})
    async with pool.connection() as conn:
        await conn.execute("UPDATE runs SET cancel_requested = true WHERE id = %s", (created.id,))
        async with conn.transaction():
            claim = await claim_next(conn, claim_params(settings, "test-worker"))
        assert claim is not None and claim.run.cancel_requested
        assert (claim.head.seq, claim.head.status) == (1, "queued")
        events = await read_events(conn, created.id, 0, 10)
    assert [kind for _, kind, _ in events] == ["run.created"]
