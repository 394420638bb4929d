"""Who sees which thread: langgraph.json's `auth.path` handlers, or agentrt's API keys."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from langgraph_sdk import get_client

from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from tests.support.live import serve

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
async def auth_url(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    config = tmp_path_factory.mktemp("lg") / "langgraph.json"
    config.write_text(
        json.dumps(
            {
                "graphs": {"tool_agent": str(ROOT / "examples/tool_agent/graph.py") + ":graph"},
                "auth": {"path": str(ROOT / "tests/support/lg_auth.py") + ":auth"},
            }
        )
    )
    app_settings = settings.model_copy(
        update={"langgraph_config": config, "cors_origins": ["https://chat.example"]}
    )
    async with serve(create_app(app_settings)) as url:
        yield url


async def test_auth_handlers_scope_threads_to_their_owner(auth_url: str) -> None:
    alice = get_client(url=auth_url, headers={"Authorization": "Bearer alice"})
    bob = get_client(url=auth_url, headers={"Authorization": "Bearer bob"})
    thread = await alice.threads.create(metadata={"topic": "dinner"})
    assert thread["metadata"] == {"topic": "dinner", "owner": "alice"}
    assert [t["thread_id"] for t in await alice.threads.search()] == [thread["thread_id"]]
    assert await bob.threads.search() == []
    with pytest.raises(httpx.HTTPStatusError) as hidden:
        await bob.threads.get(thread["thread_id"])
    assert hidden.value.response.status_code == 404
    with pytest.raises(httpx.HTTPStatusError) as no_run:
        await bob.runs.create(thread["thread_id"], "tool_agent", input={"messages": []})
    assert no_run.value.response.status_code == 404


async def test_auth_handlers_refuse_with_401_and_403(auth_url: str) -> None:
    async with httpx.AsyncClient(base_url=auth_url) as http:
        anonymous = await http.post("/threads/search", json={})
        guest = await http.put(
            "/store/items",
            json={"namespace": ["default", "n"], "key": "k", "value": {"text": "x"}},
            headers={"Authorization": "Bearer guest"},
        )
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["message"] == "send a bearer token"
    assert guest.status_code == 403


async def test_cors_lets_the_configured_origin_call_the_api(auth_url: str) -> None:
    async with httpx.AsyncClient(base_url=auth_url) as http:
        allowed = await http.options(
            "/threads/search",
            headers={
                "Origin": "https://chat.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        other = await http.options(
            "/threads/search",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://chat.example"
    assert "access-control-allow-origin" not in other.headers


@pytest.fixture(scope="module")
async def key_url(settings: Settings) -> AsyncIterator[str]:
    secured = settings.model_copy(
        update={"auth_enabled": True, "langgraph_config": ROOT / "langgraph.json"}
    )
    async with serve(create_app(secured)) as url:
        yield url


async def test_with_api_keys_a_user_sees_only_own_threads_unless_admin(
    key_url: str, pool: Pool
) -> None:
    keys = {
        name: await create_api_key(pool, "acme", name, roles)
        for name, roles in (("ann", []), ("ben", []), ("boss", ["admin"]))
    }
    ann, ben, boss = (
        get_client(url=key_url, api_key=None, headers={"Authorization": f"Bearer {keys[n]}"})
        for n in ("ann", "ben", "boss")
    )
    thread = await ann.threads.create()
    assert [t["thread_id"] for t in await ann.threads.search()] == [thread["thread_id"]]
    assert await ben.threads.search() == []
    with pytest.raises(httpx.HTTPStatusError) as hidden:
        await ben.threads.get_state(thread["thread_id"])
    assert hidden.value.response.status_code == 404
    assert (await boss.threads.get(thread["thread_id"]))["thread_id"] == thread["thread_id"]
    async with httpx.AsyncClient(base_url=key_url) as http:
        assert (await http.post("/threads/search", json={})).status_code == 401
