"""`Idempotency-Key` on posted messages: one message and run per key, clear errors otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from tests.support.live import serve
from tests.support.rows import count_rows

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    api = settings.model_copy(update={"run_workers": False})
    async with serve(create_app(api)) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


async def new_conversation(client: httpx.AsyncClient) -> str:
    return str((await client.post("/api/conversations", json={})).json()["conversationId"])


async def test_concurrent_posts_with_one_key_create_one_run(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    conv = await new_conversation(client)
    body, headers = {"content": "once"}, {"Idempotency-Key": "k-concurrent"}
    path = f"/api/conversations/{conv}/messages"
    answers = await asyncio.gather(
        *(client.post(path, json=body, headers=headers) for _ in range(20))
    )

    assert {r.status_code for r in answers} == {202}
    assert len({r.json()["runId"] for r in answers}) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in answers) == 19
    assert await count_rows(pool, "runs", "conversation_id", conv) == 1


async def test_a_retry_is_not_refused_by_the_run_it_created(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    conv = await new_conversation(client)
    path = f"/api/conversations/{conv}/messages"
    body = {"content": "one", "ifBusy": "reject"}
    first = await client.post(path, json=body, headers={"Idempotency-Key": "k-busy"})
    retry = await client.post(path, json=body, headers={"Idempotency-Key": "k-busy"})
    fresh = await client.post(path, json=body, headers={"Idempotency-Key": "k-other"})

    assert first.status_code == retry.status_code == 202, retry.text
    assert retry.json() == first.json()
    assert fresh.status_code == 409, fresh.text
    assert fresh.json()["error"]["code"] == "conversation_busy"
    assert await count_rows(pool, "runs", "conversation_id", conv) == 1


async def test_a_key_is_scoped_to_its_conversation(client: httpx.AsyncClient, pool: Pool) -> None:
    one, two = await new_conversation(client), await new_conversation(client)
    headers = {"Idempotency-Key": "k-shared"}
    a = await client.post(
        f"/api/conversations/{one}/messages", json={"content": "x"}, headers=headers
    )
    b = await client.post(
        f"/api/conversations/{two}/messages", json={"content": "x"}, headers=headers
    )

    assert a.status_code == b.status_code == 202
    assert a.json()["runId"] != b.json()["runId"]
    assert (
        await count_rows(pool, "runs", "conversation_id", one)
        == await count_rows(pool, "runs", "conversation_id", two)
        == 1
    )


async def test_the_same_key_with_another_body_is_refused_with_the_first_run(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    conv = await new_conversation(client)
    path = f"/api/conversations/{conv}/messages"
    headers = {"Idempotency-Key": "k-reused"}
    first = await client.post(path, json={"content": "first"}, headers=headers)
    other = await client.post(path, json={"content": "second"}, headers=headers)

    assert other.status_code == 422, other.text
    error = other.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["runId"] == first.json()["runId"] and "new key" in error["message"]
    assert await count_rows(pool, "runs", "conversation_id", conv) == 1


@pytest.mark.parametrize("key", [b"", b"x" * 256, "clé".encode()])
async def test_an_unusable_key_is_a_400(client: httpx.AsyncClient, pool: Pool, key: bytes) -> None:
    conv = await new_conversation(client)
    response = await client.post(
        f"/api/conversations/{conv}/messages",
        json={"content": "hi"},
        headers={"Idempotency-Key": key},
    )

    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_idempotency_key"
    assert await count_rows(pool, "runs", "conversation_id", conv) == 0
