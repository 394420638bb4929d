"""Posts to conversations the API process remembers: one round trip, and never a stale guess.

The process remembers the conversations it created or posted to and the profiles' latest
versions it read (server/runs/memo.py); a post from what it remembers is checked in its own
transaction. These tests change what was remembered behind the process's back, in the
database, and check that every post still answers as if it had read everything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from server.app import create_app
from server.db.pool import Pool
from server.runs.memo import PostMemo
from server.settings import Settings
from tests.support.live import serve

pytestmark = pytest.mark.timeout(120)
TENANT = "default"  # the principal of a server without authentication


@pytest.fixture(scope="module")
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    app = create_app(settings.model_copy(update={"run_workers": False}))
    async with serve(app) as url:
        app.state.test_url = url
        yield app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=app.state.test_url, timeout=30) as c:
        yield c


def memo(app: FastAPI) -> PostMemo:
    found: PostMemo = app.state.post_memo
    return found


async def post(client: httpx.AsyncClient, conv: str, **body: Any) -> httpx.Response:
    return await client.post(f"/api/conversations/{conv}/messages", json={"content": "hi", **body})


async def conversation(client: httpx.AsyncClient, **body: Any) -> str:
    created = await client.post("/api/conversations", json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["conversationId"])


async def test_a_newer_profile_version_written_elsewhere_is_used_at_once(
    app: FastAPI, client: httpx.AsyncClient, pool: Pool
) -> None:
    spec = {"name": "helper", "instructions": "v1"}
    assert (await client.post("/api/agents", json=spec)).status_code == 201
    first = await conversation(client, agent="helper")
    assert memo(app).conversation(TENANT, first) is not None  # met when created
    answer = await post(client, first)
    assert answer.status_code == 202, answer.text
    assert answer.json()["agent"] == {"name": "helper", "version": 1}
    remembered = memo(app).agent(TENANT, "helper")
    assert remembered is not None and remembered.version == 1

    # Another process makes version 2: this one still remembers version 1.
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO agent_profiles (tenant_id, name, version, spec, source)"
            ' SELECT tenant_id, name, 2, spec || \'{"instructions": "v2"}\', source'
            " FROM agent_profiles WHERE tenant_id = %s AND name = 'helper' AND version = 1",
            (TENANT,),
        )
    second = await conversation(client, agent="helper")
    answer = await post(client, second)
    assert answer.status_code == 202, answer.text
    assert answer.json()["agent"] == {"name": "helper", "version": 2}
    remembered = memo(app).agent(TENANT, "helper")
    assert remembered is not None and remembered.version == 2
    # Remembered again, it goes through.
    again = await post(client, await conversation(client, agent="helper"))
    assert again.json()["agent"] == {"name": "helper", "version": 2}

    # Deleted elsewhere: refused as an unknown agent, as a read would have found.
    later = await conversation(client, agent="helper")
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE agent_profiles SET deleted_at = now() WHERE tenant_id = %s AND name = 'helper'",
            (TENANT,),
        )
    refused = await post(client, later)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "unknown_agent"


async def test_a_conversation_erased_elsewhere_is_a_404(
    app: FastAPI, client: httpx.AsyncClient, pool: Pool
) -> None:
    conv = await conversation(client)
    assert (await post(client, conv)).status_code == 202
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM messages WHERE conversation_id = %s", (conv,))
        await conn.execute("DELETE FROM runs WHERE conversation_id = %s", (conv,))
        await conn.execute("DELETE FROM conversations WHERE id = %s", (conv,))
    assert memo(app).conversation(TENANT, conv) is not None
    missing = await post(client, conv)
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["code"] == "not_found"
    assert memo(app).conversation(TENANT, conv) is None  # forgotten


async def test_an_unknown_model_on_a_remembered_conversation_is_refused_after_its_404(
    app: FastAPI, client: httpx.AsyncClient, pool: Pool
) -> None:
    conv = await conversation(client)
    assert (await post(client, conv)).status_code == 202
    bad = await post(client, conv, model="scripted:nobody")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "unknown_model"
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM messages WHERE conversation_id = %s", (conv,))
        await conn.execute("DELETE FROM runs WHERE conversation_id = %s", (conv,))
        await conn.execute("DELETE FROM conversations WHERE id = %s", (conv,))
    # Both are wrong now: the conversation's 404 comes first, as on the reading path.
    both = await post(client, conv, model="scripted:nobody")
    assert both.status_code == 404, both.text
