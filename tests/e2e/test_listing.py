"""Listings page with a cursor: every row once, newest first, scoped by tenant."""

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
from tests.support.live import serve


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    # No workers: runs stay queued, so listing them races with nothing.
    secured = settings.model_copy(update={"auth_enabled": True, "run_workers": False})
    models = ModelRegistry(secured, {"hi": [ScriptedTurn(text="hello")]})
    async with serve(create_app(secured, models=models)) as url:
        yield url


async def client_for(base_url: str, pool: Pool, tenant: str, user: str) -> httpx.AsyncClient:
    key = await create_api_key(pool, tenant, user, [])
    return httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


async def all_pages(client: httpx.AsyncClient, path: str, field: str) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        response = await client.get(path, params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append([row[f"{field}Id"] for row in body[f"{field}s"]])
        cursor = body["nextCursor"]
        if cursor is None:
            return pages
        assert len(pages) < 20, "the cursor never ran out"


async def test_runs_come_in_cursor_pages_newest_first(base_url: str, pool: Pool) -> None:
    async with await client_for(base_url, pool, "acme", "ann") as ann:
        conv = (await ann.post("/api/conversations", json={})).json()["conversationId"]
        posted = []
        for i in range(5):
            response = await ann.post(
                f"/api/conversations/{conv}/messages",
                json={"content": f"message {i}", "model": "scripted:hi"},
            )
            assert response.status_code == 202, response.text
            posted.append(response.json()["runId"])
        pages = await all_pages(ann, f"/api/conversations/{conv}/runs", "run")
        assert pages == [posted[4:2:-1], posted[2:0:-1], posted[:1]]
        tenant_pages = await all_pages(ann, "/api/runs", "run")
        assert [run for page in tenant_pages for run in page] == posted[::-1]


async def test_conversations_are_listed_per_tenant_a_page_at_a_time(
    base_url: str, pool: Pool
) -> None:
    async with (
        await client_for(base_url, pool, "globex", "gus") as gus,
        await client_for(base_url, pool, "globex", "gail") as gail,
        await client_for(base_url, pool, "initech", "ivy") as ivy,
    ):
        made = []
        for client in (gus, gail, gus):
            response = await client.post("/api/conversations", json={"title": "t"})
            made.append(response.json()["conversationId"])
        await ivy.post("/api/conversations", json={})
        pages = await all_pages(gail, "/api/conversations", "conversation")
        assert pages == [made[:0:-1], made[:1]]


async def test_a_cursor_from_elsewhere_is_a_clear_422(base_url: str, pool: Pool) -> None:
    async with (
        await client_for(base_url, pool, "umbrella", "uma") as uma,
        await client_for(base_url, pool, "hooli", "hank") as hank,
    ):
        conv = (await uma.post("/api/conversations", json={})).json()["conversationId"]
        for cursor in (conv, "conv_nope"):
            response = await hank.get("/api/conversations", params={"cursor": cursor})
            assert response.status_code == 422, response.text
            assert response.json()["error"]["code"] == "invalid_cursor"
            assert "nextCursor" in response.json()["error"]["message"]
