"""Limits and policies: per-user fairness, 429, busy conversations, timeouts, cancel races."""

from __future__ import annotations

import asyncio
import itertools
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
from tests.support.live import SseEvent, read_sse, serve

SCRIPTS = {
    "slowish": [ScriptedTurn(text="steady " * 20, chunk_chars=7, delay_s=0.03)],
    "quick": [ScriptedTurn(text="done")],
    "forever": [ScriptedTurn(text="never " * 1000, chunk_chars=6, delay_s=0.05)],
}
TERMINAL = ("run.completed", "run.failed", "run.cancelled")


@pytest.fixture(scope="module")
def limited(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth_enabled": True, "user_max_active_runs": 1})


@pytest.fixture(scope="module")
async def base_url(limited: Settings) -> AsyncIterator[str]:
    async with serve(create_app(limited, models=ModelRegistry(limited, SCRIPTS))) as url:
        yield url


@pytest.fixture(scope="module")
async def keys(pool: Pool, base_url: str) -> dict[str, str]:
    return {
        "alice": await create_api_key(pool, "acme", "alice", []),
        "bob": await create_api_key(pool, "acme", "bob", []),
        "admin": await create_api_key(pool, "acme", "ops", ["admin"]),
    }


def client_for(base_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url, timeout=30, headers={"Authorization": f"Bearer {key}"}
    )


async def post(
    client: httpx.AsyncClient, model: str, conv: str | None = None, **body: Any
) -> httpx.Response:
    if conv is None:
        conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    return await client.post(
        f"/api/conversations/{conv}/messages",
        json={"content": "go", "model": f"scripted:{model}", **body},
    )


def span(events: list[SseEvent]) -> tuple[str, str]:
    start = next(e.data["ts"] for e in events if e.event == "run.started")
    end = next(e.data["ts"] for e in events if e.event in TERMINAL)
    return start, end


async def test_a_users_burst_does_not_starve_another_user(
    base_url: str, keys: dict[str, str]
) -> None:
    async with (
        client_for(base_url, keys["alice"]) as alice,
        client_for(base_url, keys["bob"]) as bob,
    ):
        burst = [(await post(alice, "slowish")).json() for _ in range(3)]
        bobs = (await post(bob, "slowish")).json()
        alice_events = [await read_sse(alice, r["streamUrl"]) for r in burst]
        bob_events = await read_sse(bob, bobs["streamUrl"])
    spans = sorted(span(e) for e in alice_events)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, "alice had two runs active at once (limit 1)"
    third_start = spans[2][0]
    assert span(bob_events)[0] < third_start, "bob waited behind alice's whole burst"


async def test_reject_policy_answers_429_over_the_limit(
    limited: Settings, keys: dict[str, str], pool: Pool
) -> None:
    strict = limited.model_copy(update={"limit_policy": "reject", "run_workers": False})
    app = create_app(strict, models=ModelRegistry(strict, SCRIPTS))
    async with serve(app) as url, client_for(url, keys["bob"]) as bob:
        first = await post(bob, "quick")
        assert first.status_code == 202
        second = await post(bob, "quick")
        assert second.status_code == 429
        assert "limit is 1" in second.json()["error"]["message"]
        assert second.headers["Retry-After"]
        await bob.post(f"/api/runs/{first.json()['runId']}/cancel")


async def test_second_message_policies(base_url: str, keys: dict[str, str]) -> None:
    async with client_for(base_url, keys["alice"]) as alice:
        conv = (await alice.post("/api/conversations", json={})).json()["conversationId"]
        first = (await post(alice, "forever", conv)).json()
        await _wait_status(alice, first["runId"], "running")

        rejected = await post(alice, "quick", conv, ifBusy="reject")
        assert rejected.status_code == 409
        assert first["runId"] in rejected.json()["error"]["message"]

        queued = (await post(alice, "quick", conv, ifBusy="enqueue")).json()
        interrupting = (await post(alice, "quick", conv, ifBusy="interrupt")).json()
        first_events = await read_sse(alice, first["streamUrl"])
        queued_events = await read_sse(alice, queued["streamUrl"])
        last_events = await read_sse(alice, interrupting["streamUrl"])
    assert first_events[-1].event == "run.cancelled"
    assert queued_events[-1].event == "run.cancelled"  # interrupt cancels what was waiting too
    assert last_events[-1].event == "run.completed"
    assert span(last_events)[0] >= first_events[-1].data["ts"]


async def test_enqueued_message_runs_after_the_first_finishes(
    base_url: str, keys: dict[str, str]
) -> None:
    async with client_for(base_url, keys["bob"]) as bob:
        conv = (await bob.post("/api/conversations", json={})).json()["conversationId"]
        first = (await post(bob, "slowish", conv)).json()
        second = (await post(bob, "quick", conv)).json()
        one = await read_sse(bob, first["streamUrl"])
        two = await read_sse(bob, second["streamUrl"])
    assert one[-1].event == two[-1].event == "run.completed"
    assert span(two)[0] >= span(one)[1]


async def test_run_timeout_fails_the_run_with_reason_timeout(
    base_url: str, keys: dict[str, str]
) -> None:
    async with client_for(base_url, keys["bob"]) as bob:
        run = (await post(bob, "forever", options={"timeoutSeconds": 0.5})).json()
        events = await read_sse(bob, run["streamUrl"])
        record = (await bob.get(f"/api/runs/{run['runId']}")).json()
    assert events[-1].event == "run.failed"
    assert events[-1].data["data"]["errorType"] == "timeout"
    assert record["error"]["type"] == "timeout"


async def test_cancel_racing_completion_ends_in_one_consistent_state(
    base_url: str, keys: dict[str, str]
) -> None:
    async with client_for(base_url, keys["admin"]) as ops:
        runs = [(await post(ops, "quick")).json() for _ in range(12)]
        cancels = await asyncio.gather(*(ops.post(f"/api/runs/{r['runId']}/cancel") for r in runs))
        for run, cancel in zip(runs, cancels, strict=True):
            assert cancel.status_code in (202, 409)
            events = await read_sse(ops, run["streamUrl"])
            terminal = [e.event for e in events if e.event in TERMINAL]
            assert len(terminal) == 1 and events[-1].event == terminal[0]
            record = (await ops.get(f"/api/runs/{run['runId']}")).json()
            snap = (await ops.get(f"/api/runs/{run['runId']}/snapshot")).json()
            assert record["status"] == snap["status"] == terminal[0].split(".")[1]
            if cancel.status_code == 409:
                assert record["status"] == "completed"


async def test_admin_queue_shows_the_tenant_admin_its_tenant_and_needs_the_admin_role(
    base_url: str, keys: dict[str, str]
) -> None:
    async with client_for(base_url, keys["alice"]) as alice:
        assert (await alice.get("/api/admin/queue")).status_code == 403
    async with client_for(base_url, keys["admin"]) as ops:
        body = (await ops.get("/api/admin/queue")).json()
    assert body["scope"] == "tenant" and body["tenantId"] == "acme"
    assert set(body["counts"]) >= {"queued", "running", "waiting_user"}
    assert all(w["host"] is None for w in body["workers"])
    assert body["expiredLeases"] == []


async def _wait_status(client: httpx.AsyncClient, run_id: str, status: str) -> None:
    async with asyncio.timeout(20):
        while True:
            if (await client.get(f"/api/runs/{run_id}")).json()["status"] == status:
                return
            await asyncio.sleep(0.02)
