"""An attempt whose lease the reaper took back writes nothing more, even before a new claim."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from server.app import create_app
from server.auth import Principal
from server.db.pool import Pool
from server.errors import LeaseLostError
from server.events.log import NewEvent, append_events, load_head, read_events
from server.events.writer import EventWriter
from server.runs.conversations import create_conversation
from server.runs.records import create_run
from server.settings import Settings
from tests.support.live import serve

pytestmark = pytest.mark.timeout(120)

WHO = Principal("t1", "u1")


async def test_a_requeued_run_refuses_the_events_of_its_lost_attempt(
    pool: Pool, settings: Settings
) -> None:
    conv = await create_conversation(pool, WHO, None, None, {})
    run_id = (await create_run(pool, WHO, conv["id"], "hello", "demo", {})).id
    # An attempt claims the run, then loses touch with the database until its lease expires.
    async with pool.connection() as conn:
        cur = await conn.execute(
            "UPDATE runs SET lease_generation = lease_generation + 1, lease_owner = 'lost',"
            " lease_expires_at = now() - interval '1 second' WHERE id = %s"
            " RETURNING lease_generation",
            (run_id,),
        )
        row = await cur.fetchone()
        assert row is not None
        started = NewEvent("run.started", {"attempt": 1})
        await append_events(conn, run_id, [started], generation=row["lease_generation"])

    # A server whose worker reaps expired leases but may not claim (user limit 0).
    app = create_app(settings.model_copy(update={"user_max_active_runs": 0}))
    async with serve(app):
        async with asyncio.timeout(60):
            while True:
                if await _status(pool, run_id) == "queued":
                    break
                await asyncio.sleep(0.05)

    # Back in touch, the lost attempt re-reads the run's head (as its writer does after a
    # failed append) and tries to go on, under its own generation: the requeue fenced it out.
    async with pool.connection() as conn:
        lost = await load_head(conn, run_id, lock=False)
    lost = dataclasses.replace(lost, generation=row["lease_generation"])
    writer = EventWriter(pool, lost)
    writer.emit("message.item.created", {"itemId": "late", "role": "assistant"})
    with pytest.raises(LeaseLostError):
        await writer.flush()
    await writer.close()
    async with pool.connection() as conn:
        kinds = [kind for _, kind, _ in await read_events(conn, run_id, 0, 100)]
    assert kinds == ["run.created", "run.started", "run.requeued"]


async def _status(pool: Pool, run_id: str) -> str:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,))
        row = await cur.fetchone()
    assert row is not None
    return str(row["status"])
