"""Tenants see only their own runs; bad input gets a clear 4xx and stores nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    secured = settings.model_copy(update={"auth_enabled": True, "max_message_chars": 1000})
    models = ModelRegistry(secured, {"hi": [ScriptedTurn(text="hello")]})
    async with serve(create_app(secured, models=models)) as url:
        yield url


@pytest.fixture(scope="module")
async def keys(pool: Pool, base_url: str) -> dict[str, str]:
    return {
        "a": await create_api_key(pool, "tenant-a", "alice", []),
        "b": await create_api_key(pool, "tenant-b", "bob", ["admin"]),
    }


@pytest.fixture
async def a(base_url: str, keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {keys['a']}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as c:
        yield c


@pytest.fixture
async def b(base_url: str, keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {keys['b']}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as c:
        yield c


async def counts(pool: Pool) -> dict[str, int]:
    async with pool.connection() as conn:
        out = {}
        for table in ("conversations", "messages", "runs", "run_events"):
            cur = await conn.execute(f"SELECT count(*) AS n FROM {table}")
            row = await cur.fetchone()
            assert row is not None
            out[table] = row["n"]
        return out


async def run_of_a(a: httpx.AsyncClient) -> dict[str, Any]:
    conv = (await a.post("/api/conversations", json={})).json()["conversationId"]
    run = (
        await a.post(
            f"/api/conversations/{conv}/messages", json={"content": "hi", "model": "scripted:hi"}
        )
    ).json()
    await read_sse(a, run["streamUrl"])
    return {"conv": conv, **run}


async def test_requests_without_a_valid_key_are_401(base_url: str, keys: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=base_url) as anonymous:
        response = await anonymous.get("/api/runs")
        assert response.status_code == 401
        assert "API key" in response.json()["error"]["message"]
        bad = await anonymous.get("/api/runs", headers={"Authorization": "Bearer ak_nope"})
        assert bad.status_code == 401


async def test_another_tenant_cannot_read_stream_or_cancel_a_run(
    a: httpx.AsyncClient, b: httpx.AsyncClient
) -> None:
    run = await run_of_a(a)
    rid, conv = run["runId"], run["conv"]
    for path in (
        f"/api/runs/{rid}",
        f"/api/runs/{rid}/snapshot",
        f"/api/runs/{rid}/events",
        f"/api/conversations/{conv}",
        f"/api/conversations/{conv}/runs",
        f"/api/conversations/{conv}/messages",
    ):
        response = await b.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
    assert (await b.post(f"/api/runs/{rid}/cancel")).status_code == 404
    posted = await b.post(f"/api/conversations/{conv}/messages", json={"content": "hijack"})
    assert posted.status_code == 404
    assert rid not in {r["runId"] for r in (await b.get("/api/runs")).json()["runs"]}
    assert (await a.get(f"/api/runs/{rid}")).json()["status"] == "completed"


async def test_cancel_after_completion_is_409(a: httpx.AsyncClient) -> None:
    run = await run_of_a(a)
    response = await a.post(f"/api/runs/{run['runId']}/cancel")
    assert response.status_code == 409
    assert "already completed" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"content": "hi"', 400, "not valid JSON"),
        (b'{"content": "   "}', 422, "must not be empty"),
        (b'{"content": ""}', 422, "must not be empty"),
        (b'{"text": "hi"}', 422, "content"),
        (b'{"content": "hi", "model": "nosuch:model"}', 400, "unknown model"),
        (b'{"content": "hi", "options": {"maxSteps": 0}}', 422, "maxSteps"),
        (b'{"content": "' + b"x" * 1001 + b'"}', 413, "limit is 1000"),
    ],
)
async def test_bad_messages_get_a_clear_error_and_store_nothing(
    a: httpx.AsyncClient, pool: Pool, body: bytes, status: int, words: str
) -> None:
    conv = (await a.post("/api/conversations", json={})).json()["conversationId"]
    before = await counts(pool)
    response = await a.post(
        f"/api/conversations/{conv}/messages",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]
    assert await counts(pool) == before


async def test_message_to_unknown_conversation_is_404_and_stores_nothing(
    a: httpx.AsyncClient, pool: Pool
) -> None:
    before = await counts(pool)
    response = await a.post("/api/conversations/conv_nope/messages", json={"content": "hi"})
    assert response.status_code == 404
    assert "conversation conv_nope not found" in response.json()["error"]["message"]
    assert await counts(pool) == before
