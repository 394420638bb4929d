"""The claim hands a queued run to a worker: the typed run, its head and its input message.

A module of its own, so the run it creates is the only one in its database.
"""

from __future__ import annotations

from server.auth import Principal
from server.db.pool import Pool
from server.runs.conversations import create_conversation
from server.runs.records import claim_next, create_run
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
    assert (claim.head.seq, claim.head.generation) == (created.last_event_seq, 1)
    assert claim.run.deadline_at is not None
