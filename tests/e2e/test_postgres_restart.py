"""Postgres restarted mid-run: the run still completes and nothing is left without a lease."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, rebuild_output, serve
from tests.support.postgres import server_url, stop_server

pytestmark = pytest.mark.timeout(180)

ANSWER = "resilient " * 80
SCRIPTS = {
    "long": [
        ScriptedTurn(text="Checking.", tool_calls=[ScriptedToolCall(name="current_time", args={})]),
        ScriptedTurn(text=ANSWER, chunk_chars=10, delay_s=0.03),
    ]
}


@pytest.fixture
def own_server() -> Iterator[tuple[Path, str]]:
    folder = Path(tempfile.mkdtemp(prefix="agentrt-restart-"))
    try:
        yield folder, server_url(folder, None)
    finally:
        stop_server(folder)
        shutil.rmtree(folder, ignore_errors=True)


async def test_run_completes_across_a_postgres_restart(
    settings: Settings, own_server: tuple[Path, str]
) -> None:
    folder, url = own_server
    local = settings.model_copy(
        update={"database_url": url, "lease_seconds": 2.0, "worker_poll_seconds": 0.5}
    )
    app = create_app(local, models=ModelRegistry(local, SCRIPTS))
    async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
        conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
        run = (
            await client.post(
                f"/api/conversations/{conv}/messages",
                json={"content": "go", "model": "scripted:long"},
            )
        ).json()
        async with asyncio.timeout(30):
            while True:
                snap = (await client.get(run["snapshotUrl"])).json()
                if len(snap["items"]) == 2 and len(snap["items"][1]["text"]) > 50:
                    break
                await asyncio.sleep(0.02)

        await asyncio.to_thread(stop_server, folder)
        await asyncio.sleep(1.0)  # the database stays down for a while, mid-answer
        await asyncio.to_thread(server_url, folder, None)

        async with asyncio.timeout(90):
            while True:
                try:
                    response = await client.get(f"/api/runs/{run['runId']}")
                except httpx.HTTPError:
                    response = None
                if (
                    response is not None
                    and response.status_code == 200
                    and response.json()["status"] in ("completed", "failed", "cancelled")
                ):
                    break
                await asyncio.sleep(0.2)
        events = await read_sse(client, run["streamUrl"])
        record = response.json()
        snap = (await client.get(run["snapshotUrl"])).json()
        leftover = (await client.get("/api/admin/queue")).json()

    assert record["status"] == "completed", record
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert rebuild_output(events) == snap["output"]
    assert snap["output"].endswith(ANSWER)
    assert leftover["counts"]["running"] == 0 and leftover["expiredLeases"] == []
