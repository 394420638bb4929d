"""The Postgres tool ledger: one row per call, replay, in-doubt takeover, fenced records."""

from __future__ import annotations

from server.auth import Principal
from server.db.pool import Pool
from server.runs.conversations import create_conversation
from server.runs.records import create_run
from tools.ledger import Claim, HeldOutcomes, LedgerEntry, PostgresToolLedger, idempotency_key

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


async def _rows(pool: Pool, run_id: str) -> dict[str, tuple[str, int, str | None]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tool_call_id, status, attempts, output FROM tool_ledger WHERE run_id = %s",
            (run_id,),
        )
        return {
            r["tool_call_id"]: (r["status"], r["attempts"], r["output"])
            for r in await cur.fetchall()
        }


async def _write_held(pool: Pool, held: HeldOutcomes, ids: list[str], *, commit: bool) -> None:
    async with pool.connection() as conn:
        tx = conn.transaction(force_rollback=not commit)
        async with tx, conn.cursor() as cur:
            await held.write(cur, ids)


async def test_a_first_attempt_writes_a_rerunnable_call_once_with_its_outcome(pool: Pool) -> None:
    held = HeldOutcomes("t1")
    ledger = PostgresToolLedger(pool, "t1", held)
    run_id = await new_run(pool)
    assert (await ledger.claim(entry(run_id, "c1", 1), rerunnable=True))[0] == Claim.NEW
    # Nothing is stored before the call runs; a duplicate id in the same turn is busy.
    assert await _rows(pool, run_id) == {}
    assert (await ledger.claim(entry(run_id, "c1", 1), rerunnable=True))[0] == Claim.BUSY
    assert not await ledger.record(  # another attempt's outcome is refused
        run_id, "c1", 2, status="completed", attempts=1, duration_ms=1, output="late"
    )
    assert await ledger.record(
        run_id, "c1", 1, status="completed", attempts=2, duration_ms=3.5, output="sent"
    )
    # Written only with the outcome's event: a write without the call's id stores nothing,
    # a write rolled back stores nothing, and the batch written again stores the row.
    await _write_held(pool, held, ["other"], commit=True)
    await _write_held(pool, held, ["c1"], commit=False)
    assert await _rows(pool, run_id) == {}
    await _write_held(pool, held, ["c1"], commit=True)
    await _write_held(pool, held, ["c1"], commit=True)  # a replay's event: no change
    assert await _rows(pool, run_id) == {"c1": ("completed", 2, "sent")}
    # The same id later in the attempt replays the outcome; so does a later attempt.
    state, found = await ledger.claim(entry(run_id, "c1", 1), rerunnable=True)
    assert state == Claim.RECORDED and found.output == "sent"
    state, found = await PostgresToolLedger(pool, "t1").claim(entry(run_id, "c1", 2))
    assert state == Claim.RECORDED and (found.output, found.attempts) == ("sent", 2)


async def test_a_first_attempt_still_claims_a_call_that_cannot_run_twice(pool: Pool) -> None:
    held = HeldOutcomes("t1")
    ledger = PostgresToolLedger(pool, "t1", held)
    run_id = await new_run(pool)
    assert (await ledger.claim(entry(run_id, "c1", 1)))[0] == Claim.NEW
    assert await _rows(pool, run_id) == {"c1": ("started", 0, None)}
    # Its id, used again by a call that could run twice, is the database row's: busy.
    assert (await ledger.claim(entry(run_id, "c1", 1), rerunnable=True))[0] == Claim.BUSY
    assert held.entries == {}
    assert await ledger.record(
        run_id, "c1", 1, status="completed", attempts=1, duration_ms=1, output="sent"
    )
    assert await _rows(pool, run_id) == {"c1": ("completed", 1, "sent")}


async def test_a_later_attempt_claims_every_call_first(pool: Pool) -> None:
    ledger = PostgresToolLedger(pool, "t1")  # no held outcomes: not a first attempt
    run_id = await new_run(pool)
    assert (await ledger.claim(entry(run_id, "c1", 2), rerunnable=True))[0] == Claim.NEW
    assert await _rows(pool, run_id) == {"c1": ("started", 0, None)}


async def test_a_first_attempt_holds_calls_only_up_to_its_limits(pool: Pool) -> None:
    held = HeldOutcomes("t1", max_calls=3, max_chars=10)
    ledger = PostgresToolLedger(pool, "t1", held)
    run_id = await new_run(pool)
    assert (await ledger.claim(entry(run_id, "c1", 1), rerunnable=True))[0] == Claim.NEW
    assert await ledger.record(
        run_id, "c1", 1, status="completed", attempts=1, duration_ms=1, output="x" * 10
    )
    # The outputs held reached max_chars: the next call is claimed in the database.
    assert (await ledger.claim(entry(run_id, "c2", 1), rerunnable=True))[0] == Claim.NEW
    assert await _rows(pool, run_id) == {"c2": ("started", 0, None)}
    assert list(held.entries) == ["c1"]

    few = HeldOutcomes("t1", max_calls=1)
    ledger = PostgresToolLedger(pool, "t1", few)
    run_id = await new_run(pool)
    await ledger.claim(entry(run_id, "c1", 1), rerunnable=True)
    await ledger.claim(entry(run_id, "c2", 1), rerunnable=True)
    assert list(few.entries) == ["c1"]
    assert await _rows(pool, run_id) == {"c2": ("started", 0, None)}
