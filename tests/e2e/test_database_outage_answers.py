"""A real `agentrt serve` process while its Postgres restarts: 503s, never 500s, and no duplicates.

The API process keeps pooled connections across the restart; a client that retries a message
with the same `Idempotency-Key` gets exactly one message and one run.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api_server import api_server
from tests.support.postgres import server_url, stop_server
from tests.support.processes import worker_env

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[tuple[Path, str]]:
    folder = Path(tempfile.mkdtemp(prefix="agentrt-outage-"))
    try:
        yield folder, server_url(folder, None)
    finally:
        stop_server(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
async def client(own_postgres: tuple[Path, str]) -> AsyncIterator[httpx.AsyncClient]:
    env = worker_env(own_postgres[1], db_pool_min=4, db_pool_timeout_s=3.0, log_level="warning")
    async with api_server(env) as base, httpx.AsyncClient(base_url=base, timeout=60) as c:
        yield c


def check_answer(response: httpx.Response) -> None:
    """A success, or a 503 that says when to retry in the API's error shape; never a 500."""
    if response.status_code < 300:
        return
    assert response.status_code == 503, (response.status_code, response.text)
    assert int(response.headers["Retry-After"]) > 0
    error = response.json()["error"]
    assert error["code"] == "database_unavailable" and "retry" in error["message"], error


async def post_until_accepted(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], key: str
) -> httpx.Response:
    """Send the message as a careful client does: retry 503s with the same key."""
    async with asyncio.timeout(120):
        while True:
            response = await client.post(path, json=body, headers={"Idempotency-Key": key})
            check_answer(response)
            if response.status_code == 202:
                return response
            await asyncio.sleep(float(response.headers["Retry-After"]) / 4)


async def test_requests_after_a_postgres_restart_succeed_on_fresh_connections(
    client: httpx.AsyncClient, own_postgres: tuple[Path, str]
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    warm = await asyncio.gather(*(client.get(f"/api/conversations/{conv}") for _ in range(8)))
    assert {r.status_code for r in warm} == {200}

    # Restarted while the API is idle: every pooled connection is now dead.
    await asyncio.to_thread(stop_server, own_postgres[0])
    await asyncio.to_thread(server_url, own_postgres[0], None)

    after = await asyncio.gather(*(client.get(f"/api/conversations/{conv}") for _ in range(8)))
    assert [r.status_code for r in after] == [200] * 8, [r.text for r in after]
    posted = await client.post(f"/api/conversations/{conv}/messages", json={"content": "hi"})
    assert posted.status_code == 202, posted.text


async def test_requests_during_a_postgres_outage_get_503_and_a_retried_message_is_stored_once(
    client: httpx.AsyncClient, own_postgres: tuple[Path, str]
) -> None:
    folder = own_postgres[0]
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    messages_path = f"/api/conversations/{conv}/messages"
    conv_path = f"/api/conversations/{conv}"
    before = await client.post(messages_path, json={"content": "before"})
    assert before.status_code == 202, before.text
    # Several pooled connections, all of which the restart leaves dead.
    warm = await asyncio.gather(*(client.get(conv_path) for _ in range(8)))
    assert {r.status_code for r in warm} == {200}

    await asyncio.to_thread(stop_server, folder)
    key = str(uuid.uuid4())
    body = {"content": "sent while the database restarts"}
    during = await asyncio.gather(
        client.get(conv_path),
        client.get(f"/api/runs/{before.json()['runId']}"),
        client.post(messages_path, json=body, headers={"Idempotency-Key": key}),
    )
    for response in during:
        check_answer(response)
        assert response.status_code == 503, response.text

    await asyncio.to_thread(server_url, folder, None)
    after = await asyncio.gather(*(client.get(conv_path) for _ in range(8)))
    for response in after:
        check_answer(response)
    accepted = await post_until_accepted(client, messages_path, body, key)

    again = await client.post(messages_path, json=body, headers={"Idempotency-Key": key})
    assert again.status_code == 202, again.text
    assert again.json() == accepted.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    other = await client.post(
        messages_path, json={"content": "something else"}, headers={"Idempotency-Key": key}
    )
    assert other.status_code == 422, other.text
    assert other.json()["error"]["code"] == "idempotency_key_reused"

    messages = (await client.get(messages_path)).json()["messages"]
    assert [m["content"] for m in messages] == ["before", body["content"]]
    runs = (await client.get(f"{conv_path}/runs")).json()["runs"]
    assert {r["runId"] for r in runs} == {before.json()["runId"], accepted.json()["runId"]}
