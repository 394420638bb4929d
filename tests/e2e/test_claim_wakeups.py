"""A run held back in the queue starts as soon as what held it ends, not at the next poll.

The worker claims again after a run ends only while it knows of queued runs (docs/decisions/
1930); these tests poll so rarely that only those wake-ups can start the held runs in time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import serve

pytestmark = pytest.mark.timeout(240)
POLL_S = 600.0  # far beyond every deadline below: a run started by the poll fails the test
DEADLINE_S = 90.0
SCRIPTS = {"slow": [ScriptedTurn(text="word " * 40, chunk_chars=5, delay_s=0.03)]}


@pytest.fixture(scope="module")
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    rare_polls = settings.model_copy(
        update={"worker_poll_seconds": POLL_S, "worker_concurrency": 2}
    )
    app = create_app(rare_polls, models=ModelRegistry(rare_polls, SCRIPTS))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


async def _post(client: httpx.AsyncClient, conversation: str | None = None) -> dict[str, Any]:
    if conversation is None:
        conversation = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conversation}/messages",
        json={"content": "go", "model": "scripted:slow"},
    )
    assert response.status_code == 202, response.text
    return {**response.json(), "conversationId": conversation}


async def _status(client: httpx.AsyncClient, run_id: str) -> str:
    return str((await client.get(f"/api/runs/{run_id}")).json()["status"])


async def _wait_for(client: httpx.AsyncClient, run_id: str, wanted: set[str]) -> str:
    start = time.monotonic()
    while time.monotonic() - start < DEADLINE_S:
        status = await _status(client, run_id)
        if status in wanted:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} still {status} after {DEADLINE_S:.0f} s")


async def test_the_next_message_of_a_conversation_starts_when_the_run_before_it_ends(
    client: httpx.AsyncClient,
) -> None:
    first = await _post(client)
    await _wait_for(client, first["runId"], {"running"})
    second = await _post(client, first["conversationId"])
    assert await _status(client, second["runId"]) == "queued"
    await _wait_for(client, first["runId"], {"completed"})
    assert await _wait_for(client, second["runId"], {"completed"}) == "completed"


async def test_a_run_queued_while_every_slot_is_busy_starts_when_one_frees(
    client: httpx.AsyncClient,
) -> None:
    busy = [await _post(client), await _post(client)]
    for run in busy:
        await _wait_for(client, run["runId"], {"running"})
    waiting = await _post(client)
    assert await _status(client, waiting["runId"]) == "queued"
    assert await _wait_for(client, waiting["runId"], {"completed"}) == "completed"
    # And once nothing is queued, a run posted later is claimed by its notification alone.
    later = await _post(client)
    assert await _wait_for(client, later["runId"], {"completed"}) == "completed"
