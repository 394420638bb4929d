"""Which queued run a claim takes: fairness, limits, conversation order, locks, long queues."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from graphs.events import EventType
from server.auth import Principal
from server.db.pool import Pool
from server.domain import Run
from server.events.log import NewEvent, append_events
from server.runs.conversations import create_conversation
from server.runs.records import _CLAIM, claim_next, create_run
from server.runs.worker import claim_params
from server.settings import Settings

ALICE = Principal("t1", "alice")
BOB = Principal("t1", "bob")
CAROL = Principal("t2", "carol")


@pytest.fixture(autouse=True)
async def empty_queue(pool: Pool) -> AsyncIterator[None]:
    """Each test starts without runs: the claim looks at every tenant's queue."""
    async with pool.connection() as conn:
        await conn.execute("TRUNCATE conversations CASCADE")
    yield


async def queue(pool: Pool, who: Principal, conversation: str | None = None) -> Run:
    """Queue a run for `who`, in a new conversation unless one is named."""
    if conversation is None:
        conversation = (await create_conversation(pool, who, None, None, {}))["id"]
    return await create_run(pool, who, conversation, "go", "demo", {})


async def start(pool: Pool, settings: Settings) -> Run | None:
    """Claim the next run and mark it started, as the worker does; return it."""
    async with pool.connection() as conn, conn.transaction():
        claim = await claim_next(conn, claim_params(settings, "test-worker"))
        if claim is None:
            return None
        started = NewEvent(EventType.RUN_STARTED, {"attempt": 1, "worker": "test-worker"})
        await append_events(
            conn, claim.run.id, [started], generation=claim.run.lease_generation, head=claim.head
        )
    return claim.run


async def test_a_user_without_active_runs_goes_before_an_older_run_of_a_busy_user(
    pool: Pool, settings: Settings
) -> None:
    first = await queue(pool, ALICE)
    older = await queue(pool, ALICE)
    newer = await queue(pool, BOB)
    assert (await start(pool, settings)).id == first.id  # type: ignore[union-attr]
    assert (await start(pool, settings)).id == newer.id  # type: ignore[union-attr]
    assert (await start(pool, settings)).id == older.id  # type: ignore[union-attr]
    assert await start(pool, settings) is None


async def test_among_busy_users_the_one_with_fewer_active_runs_goes_first(
    pool: Pool, settings: Settings
) -> None:
    for _ in range(2):
        await queue(pool, ALICE)
    await queue(pool, BOB)
    assert {(await start(pool, settings)).user_id for _ in range(3)} == {"alice", "bob"}  # type: ignore[union-attr]
    # Alice holds two runs, Bob one: Bob's later run goes before Alice's earlier one.
    alices = await queue(pool, ALICE)
    bobs = await queue(pool, BOB)
    assert (await start(pool, settings)).id == bobs.id  # type: ignore[union-attr]
    assert (await start(pool, settings)).id == alices.id  # type: ignore[union-attr]


async def test_a_user_at_the_limit_is_skipped_for_other_users_runs(
    pool: Pool, settings: Settings
) -> None:
    limited = settings.model_copy(update={"user_max_active_runs": 1})
    await queue(pool, ALICE)
    blocked = await queue(pool, ALICE)
    other = await queue(pool, BOB)
    await start(pool, limited)
    assert (await start(pool, limited)).id == other.id  # type: ignore[union-attr]
    assert await start(pool, limited) is None
    assert (await start(pool, settings)).id == blocked.id  # type: ignore[union-attr]


async def test_tenant_overrides_of_the_limits_apply(pool: Pool, settings: Settings) -> None:
    overridden = settings.model_copy(
        update={"tenant_limits": {"t1": {"tenantMaxActiveRuns": 1}, "t2": {"userMaxActiveRuns": 0}}}
    )
    await queue(pool, ALICE)
    await queue(pool, BOB)
    await queue(pool, CAROL)
    assert (await start(pool, overridden)).user_id == "alice"  # type: ignore[union-attr]
    # Bob's tenant is full and Carol's tenant allows no active run per user.
    assert await start(pool, overridden) is None


async def test_a_tenants_limit_counts_the_active_runs_of_all_its_users(
    pool: Pool, settings: Settings
) -> None:
    limited = settings.model_copy(update={"tenant_limits": {"t1": {"tenantMaxActiveRuns": 3}}})
    dave = Principal("t1", "dave")
    for who in (ALICE, ALICE, BOB):
        await queue(pool, who)
    assert {(await start(pool, limited)).user_id for _ in range(3)} == {"alice", "bob"}  # type: ignore[union-attr]
    # Two of Alice's and one of Bob's make three in t1: Dave, with none, waits all the same,
    # while Carol, of another tenant, goes.
    await queue(pool, dave)
    carols = await queue(pool, CAROL)
    assert (await start(pool, limited)).id == carols.id  # type: ignore[union-attr]
    assert await start(pool, limited) is None
    # With room for four, Dave's run goes.
    roomier = settings.model_copy(update={"tenant_limits": {"t1": {"tenantMaxActiveRuns": 4}}})
    assert (await start(pool, roomier)).user_id == "dave"  # type: ignore[union-attr]


async def test_a_conversation_runs_its_runs_one_at_a_time_in_order(
    pool: Pool, settings: Settings
) -> None:
    first = await queue(pool, ALICE)
    second = await queue(pool, ALICE, first.conversation_id)
    assert (await start(pool, settings)).id == first.id  # type: ignore[union-attr]
    assert await start(pool, settings) is None
    assert second.status == "queued"


async def test_a_run_locked_by_another_transaction_is_skipped(
    pool: Pool, settings: Settings
) -> None:
    locked = await queue(pool, ALICE)
    free = await queue(pool, BOB)
    async with pool.connection() as other, other.transaction():
        await other.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", (locked.id,))
        assert (await start(pool, settings)).id == free.id  # type: ignore[union-attr]


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


async def test_a_claim_reads_a_handful_of_rows_however_long_the_queue(
    pool: Pool, settings: Settings
) -> None:
    for _ in range(3):
        await queue(pool, ALICE)
        await start(pool, settings)
    async with pool.connection() as conn:
        # 5,000 queued runs of 100 users, Alice (who holds leases) among them.
        await conn.execute(
            "INSERT INTO conversations (id, tenant_id, user_id)"
            " SELECT 'c' || i, 't1', CASE WHEN i % 100 = 0 THEN 'alice' ELSE 'u' || i % 100 END"
            " FROM generate_series(1, 5000) i"
        )
        await conn.execute(
            "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id,"
            " created_at) SELECT 'r' || i, 'c' || i, 't1', CASE WHEN i % 100 = 0 THEN 'alice'"
            " ELSE 'u' || i % 100 END, 'demo', 'none', now() + i * interval '1 ms'"
            " FROM generate_series(1, 5000) i"
        )
        await conn.execute("ANALYZE runs")
        params = claim_params(settings, "test-worker")
        async with conn.transaction(force_rollback=True):
            cur = await conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + _CLAIM,
                {**params, "overrides": Jsonb(settings.tenant_limits), "only": True},
            )
            row = await cur.fetchone()
    assert row is not None
    plan = row["QUERY PLAN"]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    read = [n for n in _nodes(plan[0]["Plan"]) if n.get("Relation Name") == "runs"]
    assert read, "the plan reads no runs"
    worst = max(n["Actual Rows"] * n["Actual Loops"] for n in read)
    assert worst < 100, f"a node of the claim read {worst} runs of a 5,000-run queue"
