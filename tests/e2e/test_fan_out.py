"""Many streams on one live run each get the whole log after their cursor, exactly once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import SseEvent, read_sse, serve

STREAMING = [
    ScriptedTurn(tool_calls=[ScriptedToolCall(name="current_time", args={})]),
    ScriptedTurn(text="abcdefghij" * 30, chunk_chars=1, delay_s=0.002),
]


@pytest.fixture(scope="module", params=[10_000, 3], ids=["feed", "tiny-feed-memory"])
async def client(
    request: pytest.FixtureRequest, settings: Settings
) -> AsyncIterator[httpx.AsyncClient]:
    local = settings.model_copy(update={"sse_feed_keep": request.param})
    app = create_app(local, models=ModelRegistry(local, {"streaming": STREAMING}))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


async def start(client: httpx.AsyncClient) -> str:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": "scripted:streaming"}
    )
    return str(response.json()["runId"])


async def test_forty_streams_joining_at_random_times_and_cursors_each_see_the_whole_log(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client)
    path = f"/api/runs/{run_id}/events"
    rng = random.Random(6)

    async def follower() -> tuple[int, list[SseEvent]]:
        await asyncio.sleep(rng.uniform(0, 0.5))
        seen = (await client.get(f"/api/runs/{run_id}")).json()["lastEventId"]
        cursor = rng.randint(0, seen)
        events = await read_sse(client, path, headers={"Last-Event-ID": str(cursor)})
        return cursor, events

    async with asyncio.timeout(60):
        results = await asyncio.gather(*(follower() for _ in range(40)))
    full = await read_sse(client, path)
    assert [e.id for e in full] == list(range(1, len(full) + 1))
    assert full[-1].event == "run.completed"
    for cursor, events in results:
        assert [e.data for e in events] == [e.data for e in full[cursor:]], f"from {cursor}"
