"""The Postgres tool ledger: one row per call, replay, in-doubt takeover, fenced records."""

from __future__ import annotations

from server.auth import Principal
from server.db.pool import Pool
from server.runs.conversations import create_conversation
from server.runs.records import create_run
from tools.ledger import Claim, LedgerEntry, PostgresToolLedger, idempotency_key

WHO = Principal("t1", "u1", frozenset())


async def new_run(pool: Pool) -> str:
    conv = await create_conversation(pool, WHO, None, None, {})
    run = await create_run(pool, WHO, conv["id"], "hi", "demo", {})
    return str(run.id)


def entry(run_id: str, call_id: str, generation: int) -> LedgerEntry:
    return LedgerEntry(
        run_id,
        call_id,
        "send",
        {"to": "x"},
        idempotency_key(run_id, call_id),
        "started",
        generation,
    )


async def test_a_recorded_call_is_replayed_to_later_attempts(pool: Pool) -> None:
    ledger = PostgresToolLedger(pool, "t1")
    run_id = await new_run(pool)
    state, _ = await ledger.claim(entry(run_id, "c1", 1))
    assert state == Claim.NEW
    assert await ledger.record(
        run_id, "c1", 1, status="completed", attempts=1, duration_ms=3.5, output="sent"
    )
    state, found = await ledger.claim(entry(run_id, "c1", 2))
    assert state == Claim.RECORDED
    assert (found.output, found.attempts, found.status) == ("sent", 1, "completed")


async def test_an_unfinished_call_is_in_doubt_and_only_one_attempt_takes_it_over(
    pool: Pool,
) -> None:
    ledger = PostgresToolLedger(pool, "t1")
    run_id = await new_run(pool)
    await ledger.claim(entry(run_id, "c1", 1))
    assert (await ledger.claim(entry(run_id, "c1", 1)))[0] == Claim.BUSY
    state, found = await ledger.claim(entry(run_id, "c1", 2))
    assert state == Claim.IN_DOUBT and found.generation == 1
    assert await ledger.take_over(run_id, "c1", 2)
    assert not await ledger.take_over(run_id, "c1", 2)
    # The crashed attempt's late answer is refused: the row belongs to attempt 2 now.
    assert not await ledger.record(
        run_id, "c1", 1, status="completed", attempts=1, duration_ms=1, output="late"
    )
    assert await ledger.record(
        run_id, "c1", 2, status="failed", attempts=1, duration_ms=1, error="no", error_type="x"
    )
    _, final = await ledger.claim(entry(run_id, "c1", 3))
    assert (final.status, final.error, final.attempts) == ("failed", "no", 2)
