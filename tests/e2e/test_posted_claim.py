"""A process that serves the API and runs a worker claims a posted run in the post itself.

The post's transaction takes its run for the process's worker when the worker has a free
slot, no other run is queued and no claim is under way; otherwise the run is queued, with its
notification, as in a process without a worker. A run the post claimed started in the post's
transaction, so its `started_at` equals its `created_at`.

The worker polls only every 60 s here: a run the post left queued is claimed within the
tests' deadlines only if its queued notification was sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime

import httpx
import pytest
from fastapi import FastAPI

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.auth import Principal
from server.db.pool import Pool
from server.runs.records import CLAIM_LOCK, create_run
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import (
    post_in_new_conversation,
    read_sse,
    rebuild_output,
    serve,
    wait_for_status,
)

SCRIPTS = {
    "quick": [ScriptedTurn(text="quick answer")],
    "slow": [ScriptedTurn(text="slow answer", delay_s=1.5)],
}
# A `%` in a literal of the claim's statement must not read as a parameter of the post's.
LIMITS = {"100%": {"userMaxActiveRuns": 3}}


APPS: list[FastAPI] = []  # the app the module's tests post to, for its worker


@pytest.fixture(scope="module")
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    one_process = settings.model_copy(
        update={
            "run_workers": True,
            "worker_concurrency": 1,
            "worker_poll_seconds": 60.0,
            "tenant_limits": LIMITS,
        }
    )
    app = create_app(one_process, models=ModelRegistry(one_process, SCRIPTS))
    APPS[:] = [app]
    async with (
        serve(app) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        yield c


async def _claimed_by_post(pool: Pool, run_id: str) -> bool:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT started_at = created_at AS by_post FROM runs WHERE id = %s", (run_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return bool(row["by_post"])


async def test_a_post_starts_its_run_in_its_own_transaction(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    run = await post_in_new_conversation(client, "scripted:quick")
    events = await read_sse(client, run["streamUrl"])
    assert [e.event for e in events[:2]] == ["run.created", "run.started"]
    assert events[-1].event == "run.completed"
    assert rebuild_output(events) == "quick answer"
    assert await _claimed_by_post(pool, run["runId"])
    record = (await client.get(f"/api/runs/{run['runId']}")).json()
    assert (record["attempt"], record["recoveries"]) == (1, 0)
    assert events[1].data["data"]["worker"]
    # The events' times follow their order, though both were stored in one transaction.
    created, started = (datetime.fromisoformat(e.data["ts"]) for e in events[:2])
    assert started >= created


async def test_a_post_does_not_wait_for_a_claim_under_way(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    async with pool.connection() as holder, holder.transaction():
        # A claim under way holds the claims' lock until its transaction ends.
        await holder.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK,))
        async with asyncio.timeout(10):  # the post answers while the lock is held
            run = await post_in_new_conversation(client, "scripted:quick")
        record = (await client.get(f"/api/runs/{run['runId']}")).json()
        assert (record["status"], record["leaseOwner"]) == ("queued", None)
    # Its queued notification was sent: the worker claims it long before its next poll.
    await wait_for_status(client, run["runId"], "completed", limit_s=20)
    assert not await _claimed_by_post(pool, run["runId"])


async def test_a_post_leaves_its_run_behind_an_older_queued_one(
    client: httpx.AsyncClient, pool: Pool, settings: Settings
) -> None:
    who = Principal(settings.default_tenant, settings.default_user)
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    # Queued before the post, but not claimable for an hour.
    waiting = await create_run(pool, who, conv, "later", "scripted:quick", {}, after_s=3600)
    try:
        run = await post_in_new_conversation(client, "scripted:quick")
        await wait_for_status(client, run["runId"], "completed", limit_s=20)
        assert not await _claimed_by_post(pool, run["runId"])
    finally:
        await client.post(f"/api/runs/{waiting.id}/cancel")
    await wait_for_status(client, waiting.id, "cancelled")


async def test_a_post_leaves_its_run_queued_when_the_worker_is_full(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    slow = await post_in_new_conversation(client, "scripted:slow")
    await wait_for_status(client, slow["runId"], "running")
    run = await post_in_new_conversation(client, "scripted:quick")  # the worker's one slot is taken
    record = (await client.get(f"/api/runs/{run['runId']}")).json()
    assert record["status"] == "queued"
    await wait_for_status(client, run["runId"], "completed", limit_s=20)
    assert await _claimed_by_post(pool, slow["runId"])
    assert not await _claimed_by_post(pool, run["runId"])


async def test_a_slot_given_back_lets_the_worker_claim_a_run_queued_meanwhile(
    client: httpx.AsyncClient,
) -> None:
    worker = APPS[0].state.worker
    # As a post in flight does, hold the worker's one slot: a run posted now is queued.
    assert worker.reserve_post() is not None
    try:
        heard = worker._queued_seen
        run = await post_in_new_conversation(client, "scripted:quick")
        async with asyncio.timeout(20):  # the worker heard of it, and had no slot for it
            while True:
                if worker._queued_seen != heard:
                    break
                await asyncio.sleep(0.01)
    finally:
        worker.release_post()
    # The slot given back is used at once, not at the worker's next poll.
    await wait_for_status(client, run["runId"], "completed", limit_s=20)
