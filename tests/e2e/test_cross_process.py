"""API and worker in separate app instances: live delivery crosses them through Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import post_in_new_conversation, read_sse, rebuild_output, serve

SCRIPTS = {
    "pause": [ScriptedTurn(text="wait for it... there.", chunk_chars=8, delay_s=0.7)],
    "quick": [ScriptedTurn(text="quick answer")],
}


@pytest.fixture(scope="module")
async def api_url(settings: Settings) -> AsyncIterator[str]:
    api_only = settings.model_copy(update={"run_workers": False, "sse_heartbeat_s": 0.3})
    workers = settings.model_copy(update={"run_workers": True})
    async with (
        serve(create_app(api_only, models=ModelRegistry(api_only, SCRIPTS))) as url,
        serve(create_app(workers, models=ModelRegistry(workers, SCRIPTS))),
    ):
        yield url


async def test_events_from_a_worker_elsewhere_reach_the_api_stream(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as client:
        run = await post_in_new_conversation(client, "scripted:quick")
        events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed"
    assert rebuild_output(events) == "quick answer"
    assert events[1].data["data"]["worker"]  # run.started names the worker that claimed it


async def test_idle_stream_sends_heartbeats(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as client:
        run = await post_in_new_conversation(client, "scripted:pause")
        raw = ""
        async with client.stream("GET", run["streamUrl"]) as response:
            async for text in response.aiter_text():
                raw += text
    assert ": heartbeat\n\n" in raw
    assert raw.rstrip().split("\n")[-1].startswith("data: ")
    assert '"type":"run.completed"' in raw
