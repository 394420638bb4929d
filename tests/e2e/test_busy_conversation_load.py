"""Hundreds of concurrent messages to one conversation while worker processes run its runs.

The API runs in the test process without workers; two `agentrt worker` processes append
events (and the assistant message) for the same conversation while the posts lock it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import serve, wait_for_status
from tests.support.processes import WorkerProcess, worker_env, write_scripts

pytestmark = pytest.mark.timeout(600)

POSTS = 300
SETTINGS = {"lease_seconds": 5.0, "worker_poll_seconds": 0.5, "worker_concurrency": 4}
SCRIPTS = {"quick": [ScriptedTurn(text="Done, quickly.", chunk_chars=4)]}
TERMINAL = ("completed", "cancelled", "failed")


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scripts(tmp_path_factory.mktemp("busy") / "scripts.json", SCRIPTS)


@pytest.fixture(scope="module")
async def client(settings: Settings, scripts: Path) -> AsyncIterator[httpx.AsyncClient]:
    # Each post holds a pooled connection while it waits for the conversation's lock; on a
    # loaded machine hundreds of them outwait the pool timeout (a 503 by design, not a lock bug).
    api = settings.model_copy(
        update={
            "run_workers": False,
            "scripted_models_file": scripts,
            "db_pool_timeout_s": 300.0,
            **SETTINGS,
        }
    )
    async with (
        serve(create_app(api, models=ModelRegistry(api))) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        yield c


@pytest.fixture(scope="module")
async def running_workers(
    database_url: str, scripts: Path, client: httpx.AsyncClient
) -> AsyncIterator[list[WorkerProcess]]:
    env = worker_env(database_url, scripted_models_file=str(scripts), **SETTINGS)
    started = [WorkerProcess(env) for _ in range(2)]
    try:
        # Generous: importing the graph takes long on a loaded machine.
        await asyncio.gather(*(w.start(limit_s=240) for w in started))
        yield started
    finally:
        await asyncio.gather(*(w.close() for w in started), return_exceptions=True)


async def _post_many(base_url: str, conv: str, policy: str) -> list[httpx.Response]:
    # A client of its own: fresh connections, none that the server closed while idle.
    limits = httpx.Limits(max_connections=POSTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as burst:

        async def one(i: int) -> httpx.Response:
            body = {"content": f"message {i}", "model": "scripted:quick", "ifBusy": policy}
            return await burst.post(f"/api/conversations/{conv}/messages", json=body)

        return list(await asyncio.gather(*(one(i) for i in range(POSTS))))


async def _settle(
    client: httpx.AsyncClient, pool: Pool, conv: str, workers: list[WorkerProcess]
) -> list[dict[str, Any]]:
    """End whatever is still in progress with one interrupting message; return all runs.

    If the last run has not completed within the deadline, the failure says where every run
    of the conversation stands and what the workers printed last.
    """
    last = await client.post(
        f"/api/conversations/{conv}/messages",
        json={"content": "last", "model": "scripted:quick", "ifBusy": "interrupt"},
    )
    assert last.status_code == 202, last.text
    try:
        await wait_for_status(client, last.json()["runId"], "completed", limit_s=120)
    except TimeoutError:
        raise AssertionError(await _where_runs_stand(pool, conv, workers)) from None
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM runs WHERE conversation_id = %s", (conv,))
        return await cur.fetchall()


async def _where_runs_stand(pool: Pool, conv: str, workers: list[WorkerProcess]) -> str:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status, count(*) AS n FROM runs WHERE conversation_id = %s GROUP BY status",
            (conv,),
        )
        counts = {r["status"]: r["n"] for r in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT id, status, attempt, recoveries, lease_owner, lease_expires_at,"
            " cancel_requested, not_before, last_event_seq FROM runs"
            " WHERE conversation_id = %s AND status NOT IN ('completed', 'cancelled', 'failed')"
            " ORDER BY created_at LIMIT 5",
            (conv,),
        )
        open_runs = await cur.fetchall()
    tails = ["\n".join(w.output[-15:]) for w in workers]
    return (
        f"the last run did not complete within 120 s; runs by status: {counts}; the oldest "
        f"not ended: {open_runs}; the workers' last lines:\n" + "\n---\n".join(tails)
    )


@pytest.mark.parametrize("policy", ["enqueue", "reject", "interrupt"])
async def test_hundreds_of_concurrent_posts_to_one_conversation_never_answer_5xx(
    client: httpx.AsyncClient, pool: Pool, running_workers: list[WorkerProcess], policy: str
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    # A run in progress first, so every policy meets a busy conversation and a working worker.
    first = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "first", "model": "scripted:quick"}
    )
    assert first.status_code == 202, first.text

    responses = await _post_many(str(client.base_url), conv, policy)

    statuses = Counter(r.status_code for r in responses)
    errors = [r.text for r in responses if r.status_code >= 500]
    assert not errors, (statuses, errors[:3])
    assert set(statuses) <= ({202, 409} if policy == "reject" else {202}), statuses
    for r in responses:
        if r.status_code == 409:
            assert r.json()["error"]["code"] == "conversation_busy", r.text

    accepted = {r.json()["runId"] for r in responses if r.status_code == 202}
    runs = await _settle(client, pool, conv, running_workers)
    assert {r["id"] for r in runs} >= accepted | {first.json()["runId"]}
    assert len(runs) == len(accepted) + 2, "one run per accepted message"
    assert all(r["status"] in TERMINAL for r in runs), Counter(r["status"] for r in runs)
    messages = (await client.get(f"/api/conversations/{conv}/messages")).json()["messages"]
    users = [m for m in messages if m["role"] == "user"]
    assert sorted(m["runId"] for m in users) == sorted(r["id"] for r in runs)
    assert all(r["input_message_id"] in {m["messageId"] for m in users} for r in runs)
    completed = {r["id"] for r in runs if r["status"] == "completed"}
    answers = [m for m in messages if m["role"] == "assistant"]
    assert sorted(m["runId"] for m in answers) == sorted(completed)
    if policy == "enqueue":
        assert Counter(r["status"] for r in runs)["failed"] == 0
