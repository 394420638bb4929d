"""The console's reads: filtered runs with counts per status, paged events, usage breakdowns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import ModelPrice, Settings
from server.usage.registry import ModelRegistry
from tests.support.live import serve, wait_for_status

PRICE = ModelPrice(input_per_mtok=Decimal("1"), output_per_mtok=Decimal("2"))
SCRIPTS = {
    "cheap": [ScriptedTurn(text="cheap answer")],
    "dear": [
        ScriptedTurn(
            text="a dear answer",
            usage={"input_tokens": 100_000, "output_tokens": 50_000, "total_tokens": 150_000},
        )
    ],
    "broken": [ScriptedTurn(error="down")],
}


@dataclass
class Env:
    client: httpx.AsyncClient
    alice: dict[str, str]
    bob: dict[str, str]
    billing: dict[str, str]
    stranger: dict[str, str]
    runs: dict[str, str]


async def start(client: httpx.AsyncClient, headers: dict[str, str], script: str) -> str:
    conv = (await client.post("/api/conversations", json={}, headers=headers)).json()
    response = await client.post(
        f"/api/conversations/{conv['conversationId']}/messages",
        json={"content": "hi", "model": f"scripted:{script}"},
        headers=headers,
    )
    assert response.status_code == 202, response.text
    run_id: str = response.json()["runId"]
    return run_id


@pytest.fixture(scope="module")
async def env(settings: Settings, pool: Pool) -> AsyncIterator[Env]:
    custom = settings.model_copy(
        update={
            "auth_enabled": True,
            "model_max_attempts": 1,
            "model_prices": {"scripted:dear": PRICE, "scripted:cheap": PRICE},
        }
    )
    app = create_app(custom, models=ModelRegistry(custom, SCRIPTS))

    async def bearer(tenant: str, user: str, roles: list[str]) -> dict[str, str]:
        return {"Authorization": f"Bearer {await create_api_key(pool, tenant, user, roles)}"}

    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        alice, bob = await bearer("acme", "alice", []), await bearer("acme", "bob", [])
        runs = {
            "cheap": await start(client, alice, "cheap"),
            "dear": await start(client, bob, "dear"),
            "broken": await start(client, alice, "broken"),
        }
        for name, run_id in runs.items():
            status = "failed" if name == "broken" else "completed"
            await wait_for_status(client, run_id, status, headers=alice)
        yield Env(
            client,
            alice,
            bob,
            await bearer("acme", "carol", ["billing"]),
            await bearer("globex", "greg", ["admin"]),
            runs,
        )


async def runs(env: Env, headers: dict[str, str], **params: object) -> httpx.Response:
    return await env.client.get("/api/console/runs", params=params, headers=headers)


async def test_the_run_list_counts_every_status_and_filters(env: Env) -> None:
    page = (await runs(env, env.alice)).json()
    assert page["counts"]["completed"] == 2 and page["counts"]["failed"] == 1
    assert page["counts"]["queued"] == 0
    assert {r["runId"] for r in page["runs"]} == set(env.runs.values())

    failed = (await runs(env, env.alice, status="failed")).json()
    assert [r["runId"] for r in failed["runs"]] == [env.runs["broken"]]
    assert failed["counts"]["completed"] == 2, "counts ignore the status filter"

    by_user = (await runs(env, env.alice, user="bob")).json()
    assert [r["runId"] for r in by_user["runs"]] == [env.runs["dear"]]
    assert by_user["counts"]["completed"] == 1 and by_user["counts"]["failed"] == 0

    dear = (await runs(env, env.alice, minCost="0.1")).json()
    assert [r["runId"] for r in dear["runs"]] == [env.runs["dear"]]
    by_model = (await runs(env, env.alice, model="scripted:cheap")).json()
    assert [r["runId"] for r in by_model["runs"]] == [env.runs["cheap"]]
    later = (await runs(env, env.alice, since="2999-01-01T00:00:00Z")).json()
    assert later["runs"] == [] and sum(later["counts"].values()) == 0


async def test_the_run_list_pages_without_repeats(env: Env) -> None:
    first = (await runs(env, env.alice, limit=2)).json()
    assert len(first["runs"]) == 2 and first["nextCursor"]
    second = (await runs(env, env.alice, limit=2, cursor=first["nextCursor"])).json()
    assert second["nextCursor"] is None
    ids = [r["runId"] for r in first["runs"] + second["runs"]]
    assert sorted(ids) == sorted(env.runs.values())


async def test_stuck_and_dead_lettered_runs_are_flagged(env: Env, pool: Pool) -> None:
    stuck = await start(env.client, env.alice, "cheap")
    await wait_for_status(env.client, stuck, "completed", headers=env.alice)
    # A run that has not moved for ten minutes while unfinished, as a lost worker leaves it.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE runs SET status = 'running', updated_at = now() - interval '10 minutes'"
            " WHERE id = %s",
            (stuck,),
        )
        await conn.execute(
            "UPDATE runs SET error_type = 'dead_letter' WHERE id = %s", (env.runs["broken"],)
        )
    try:
        page = (await runs(env, env.alice)).json()
        flags = {r["runId"]: r["flags"] for r in page["runs"]}
        assert flags[stuck] == ["stuck"]
        assert flags[env.runs["broken"]] == ["dead_letter"]
        assert flags[env.runs["cheap"]] == []
        assert page["flags"] == {"stuck": 1, "deadLetter": 1}
        only = (await runs(env, env.alice, flag="stuck")).json()
        assert [r["runId"] for r in only["runs"]] == [stuck]
    finally:
        async with pool.connection() as conn:
            await conn.execute("UPDATE runs SET status = 'completed' WHERE id = %s", (stuck,))
            await conn.execute(
                "UPDATE runs SET error_type = 'model_call_failed' WHERE id = %s",
                (env.runs["broken"],),
            )


async def test_the_run_list_refuses_bad_filters_with_a_clear_error(env: Env) -> None:
    for params, field in (
        ({"status": "sleeping"}, "status"),
        ({"minCost": "-1"}, "minCost"),
        ({"since": "yesterday"}, "since"),
        ({"flag": "odd"}, "flag"),
        ({"limit": 0}, "limit"),
    ):
        response = await runs(env, env.alice, **params)
        assert response.status_code == 422, (params, response.text)
        assert field in response.json()["error"]["message"]
    bad = await runs(env, env.alice, cursor="run_nope")
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_cursor"


async def test_another_tenant_sees_none_of_the_runs(env: Env) -> None:
    page = (await runs(env, env.stranger)).json()
    assert page["runs"] == [] and sum(page["counts"].values()) == 0
    events = await env.client.get(
        f"/api/console/runs/{env.runs['cheap']}/events", headers=env.stranger
    )
    assert events.status_code == 404 and events.json()["error"]["code"] == "not_found"
    assert (await env.client.get("/api/console/runs")).status_code == 401


async def test_events_come_a_page_at_a_time_in_order_without_gaps(env: Env) -> None:
    run_id = env.runs["cheap"]
    record = (await env.client.get(f"/api/runs/{run_id}", headers=env.alice)).json()
    seen: list[int] = []
    after: int | None = 0
    while after is not None:
        page = await env.client.get(
            f"/api/console/runs/{run_id}/events",
            params={"after": after, "limit": 3},
            headers=env.alice,
        )
        assert page.status_code == 200
        body = page.json()
        assert body["lastEventId"] == record["lastEventId"]
        seen += [e["seq"] for e in body["events"]]
        assert all(e["runId"] == run_id and e["type"] and e["ts"] for e in body["events"])
        after = body["nextAfter"]
    assert seen == list(range(1, record["lastEventId"] + 1))
    tail = await env.client.get(
        f"/api/console/runs/{run_id}/events", params={"after": seen[-1]}, headers=env.alice
    )
    assert tail.json()["events"] == [] and tail.json()["nextAfter"] is None
    bad = await env.client.get(
        f"/api/console/runs/{run_id}/events", params={"limit": 10_001}, headers=env.alice
    )
    assert bad.status_code == 422


async def test_usage_is_broken_down_by_model_user_profile_and_day(env: Env) -> None:
    async def usage(headers: dict[str, str], by: str) -> dict[str, dict[str, object]]:
        response = await env.client.get("/api/console/usage", params={"by": by}, headers=headers)
        assert response.status_code == 200, response.text
        return {g["key"]: g for g in response.json()["groups"]}

    by_model = await usage(env.billing, "model")
    assert by_model["scripted:dear"]["cost"] == "0.2"
    assert by_model["scripted:dear"]["totalTokens"] == 150_000
    assert by_model["scripted:dear"]["runs"] == 1
    by_user = await usage(env.billing, "user")
    assert set(by_user) == {"alice", "bob"}
    assert by_user["bob"]["cost"] == "0.2"
    assert set(await usage(env.billing, "agent")) == {"default"}
    (day,) = (await usage(env.billing, "day")).values()
    assert day["modelCalls"] == sum(g["modelCalls"] for g in by_model.values())  # type: ignore[misc]

    # Without the billing role, a caller sees their own usage only.
    own = await usage(env.alice, "user")
    assert set(own) == {"alice"}


async def test_usage_refuses_an_empty_or_too_long_period(env: Env) -> None:
    for params in (
        {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
        {"since": "2020-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
    ):
        response = await env.client.get("/api/console/usage", params=params, headers=env.alice)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "bad_request"
    odd = await env.client.get("/api/console/usage", params={"by": "week"}, headers=env.alice)
    assert odd.status_code == 422


async def test_the_console_is_served_at_console_without_a_key(env: Env) -> None:
    root = await env.client.get("/console")
    assert root.status_code in (301, 302, 307) and root.headers["location"] == "/console/"
    page = await env.client.get("/console/")
    assert page.status_code == 200 and "agentrt console" in page.text
    script = await env.client.get("/console/js/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "https://" not in page.text, "every asset is served locally"
