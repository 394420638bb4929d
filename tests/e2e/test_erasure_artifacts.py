"""A conversation's artifacts in its erasure (records at once, bytes next) and its export."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.artifacts.retention import prune_artifacts
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import serve, wait_for_status

pytestmark = pytest.mark.timeout(240)

WRITE = ScriptedToolCall(
    id="w1",
    name="write_artifact",
    args={"name": "notes.md", "content": "# Private notes\n", "media_type": "text/markdown"},
)
SCRIPTS = {"writer": [ScriptedTurn(tool_calls=[WRITE]), ScriptedTurn(text="Saved.")]}


@pytest.fixture(scope="module")
async def app(settings: Settings, pool: Pool) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    application = create_app(settings, models=ModelRegistry(settings, SCRIPTS))
    async with serve(application) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield application, c


async def count(pool: Pool, sql: str, *args: object) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute(sql, args)
        row = await cur.fetchone()
        assert row is not None
        return int(row["n"])


async def test_an_erased_conversations_artifacts_leave_the_database_and_the_storage(
    app: tuple[FastAPI, httpx.AsyncClient], pool: Pool, settings: Settings
) -> None:
    application, client = app
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    posted = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": "scripted:writer"}
    )
    run = posted.json()["runId"]
    await wait_for_status(client, run, "completed", limit_s=120)
    listed = (await client.get(f"/api/runs/{run}/artifacts")).json()["artifacts"]
    assert [a["name"] for a in listed] == ["notes.md"]
    storage = application.state.runtime.artifacts
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT object_key FROM artifact_versions WHERE run_id = %s", (run,)
        )
        keys = [r["object_key"] for r in await cur.fetchall()]
    assert len(keys) == 1 and storage.path_of(keys[0]).exists()

    erased = await client.delete(f"/api/conversations/{conv}")

    assert erased.status_code == 200, erased.text
    assert (
        await count(pool, "SELECT count(*) AS n FROM artifacts WHERE conversation_id = %s", conv)
        == 0
    )
    assert (
        await count(pool, "SELECT count(*) AS n FROM artifact_versions WHERE run_id = %s", run) == 0
    )
    assert (await client.get(f"/api/artifacts/{listed[0]['id']}")).status_code == 404
    # The bytes go with the next housekeeping pass (or `agentrt db prune`).
    await prune_artifacts(pool, storage, settings)
    assert not storage.path_of(keys[0]).exists()
    assert await count(pool, "SELECT count(*) AS n FROM artifact_objects_erased") == 0


async def test_an_export_links_the_conversations_artifacts(
    app: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, client = app
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    posted = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": "scripted:writer"}
    )
    await wait_for_status(client, posted.json()["runId"], "completed", limit_s=120)
    exported = await client.get(f"/api/conversations/{conv}/export")
    lines = [json.loads(line) for line in exported.text.splitlines()]
    links = [line for line in lines if line["kind"] == "artifact"]
    assert [(a["name"], a["version"], a["mediaType"]) for a in links] == [
        ("notes.md", 1, "text/markdown")
    ]
    content = await client.get(links[0]["link"])
    assert content.text == "# Private notes\n"
