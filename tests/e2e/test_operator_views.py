"""The operator sees the whole installation; a tenant admin sees the same views of its tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app, default_tools
from server.auth import Principal, create_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve, wait_for_status
from tests.support.tools import launch_rocket

pytestmark = pytest.mark.timeout(120)

SCRIPTS = {
    "hello": [ScriptedTurn(text="hi")],
    "rocket": [
        ScriptedTurn(tool_calls=[ScriptedToolCall(name="launch_rocket", args={"target": "moon"})]),
        ScriptedTurn(text="Launched."),
    ],
}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
async def clients(settings: Settings, pool: Pool) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """Clients for an operator, two tenants' admins and a plain user, with runs in place.

    tenant-a has one completed run; tenant-b has one completed run and one waiting for an
    approval.
    """
    secured = settings.model_copy(update={"auth_enabled": True})
    app = create_app(
        secured,
        models=ModelRegistry(secured, SCRIPTS),
        tools=[*default_tools(secured), launch_rocket],
    )
    keys = {
        "operator": await create_api_key(pool, "ops", "prometheus", ["operator"]),
        "admin_a": await create_api_key(pool, "tenant-a", "alice", ["admin"]),
        "admin_b": await create_api_key(pool, "tenant-b", "bob", ["admin"]),
        "user_a": await create_api_key(pool, "tenant-a", "carol", []),
    }
    async with serve(app) as url:
        made = {
            name: httpx.AsyncClient(
                base_url=url, timeout=30, headers={"Authorization": f"Bearer {key}"}
            )
            for name, key in keys.items()
        }
        await start(made["user_a"], "hello", wait=True)
        await start(made["admin_b"], "hello", wait=True)
        waiting = await start(made["admin_b"], "rocket", wait=False)
        await wait_for_status(made["admin_b"], waiting, "waiting_user")
        yield made
        for client in made.values():
            await client.aclose()


async def start(client: httpx.AsyncClient, model: str, *, wait: bool) -> str:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    accepted = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": f"scripted:{model}"}
    )
    assert accepted.status_code == 202, accepted.text
    run = accepted.json()
    if wait:
        assert (await read_sse(client, run["streamUrl"]))[-1].event == "run.completed"
    return str(run["runId"])


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def tenants(samples: Samples) -> set[str]:
    return {v for _, labels in samples for k, v in labels if k == "tenant"}


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


async def test_a_tenant_admin_scrapes_only_its_own_tenants_series(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    own = await scrape(clients["admin_a"])
    assert tenants(own) == {"tenant-a"}
    assert own[("agentrt_runs", (("status", "completed"), ("tenant", "tenant-a")))] == 1
    assert own[("agentrt_runs_finished_total", (("status", "completed"), ("tenant", "tenant-a")))]
    assert own[("agentrt_queue_depth", (("tenant", "tenant-a"),))] == 0
    # Installation-wide series mix tenants (and name other tenants' tools): operator only.
    shared = {"agentrt_workers", "agentrt_tokens_total", "agentrt_tool_call_seconds_count"}
    assert not names(own) & shared

    other = await scrape(clients["admin_b"])
    assert tenants(other) == {"tenant-b"}
    assert other[("agentrt_runs", (("status", "waiting_user"), ("tenant", "tenant-b")))] == 1


async def test_the_operator_scrapes_every_tenant_and_the_installation(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    every = await scrape(clients["operator"])
    assert {"tenant-a", "tenant-b"} <= tenants(every)
    assert every[("agentrt_workers", ())] >= 1
    assert every[("agentrt_runs", (("status", "waiting_user"), ("tenant", "tenant-b")))] == 1


async def test_a_tenant_admin_sees_its_own_queue_without_worker_hosts(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    own = (await clients["admin_a"].get("/api/admin/queue")).json()
    assert own["scope"] == "tenant" and own["tenantId"] == "tenant-a"
    assert own["counts"]["waiting_user"] == 0
    assert own["workers"] == [] and own["expiredLeases"] == []

    other = (await clients["admin_b"].get("/api/admin/queue")).json()
    assert other["counts"]["waiting_user"] == 1

    every = (await clients["operator"].get("/api/admin/queue")).json()
    assert every["scope"] == "installation"
    assert every["counts"]["waiting_user"] >= 1
    assert every["workers"] and all(w["host"] and w["pid"] for w in every["workers"])


async def test_a_tenant_admin_sees_the_workers_running_its_runs_without_their_hosts(
    clients: dict[str, httpx.AsyncClient], pool: Pool
) -> None:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM workers LIMIT 1")
        row = await cur.fetchone()
        assert row is not None
        worker = row["id"]
        # A run of tenant-a held by that worker, as it is while a model call streams.
        await conn.execute(
            "UPDATE runs SET status = 'running', lease_owner = %s,"
            " lease_expires_at = now() + interval '1 hour'"
            " WHERE tenant_id = 'tenant-a' AND status = 'completed'",
            (worker,),
        )
    try:
        own = (await clients["admin_a"].get("/api/admin/queue")).json()
    finally:
        async with pool.connection() as conn:
            await conn.execute(
                "UPDATE runs SET status = 'completed', lease_owner = NULL"
                " WHERE tenant_id = 'tenant-a' AND status = 'running'"
            )
    (seen,) = own["workers"]
    assert seen["activeRuns"] == 1 and seen["host"] is None and seen["pid"] is None
    assert seen["workerId"] == worker.rsplit(":", 1)[-1] and ":" not in seen["workerId"]


async def test_only_operators_and_admins_get_the_views(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    for path in ("/metrics", "/api/admin/queue"):
        refused = await clients["user_a"].get(path)
        assert refused.status_code == 403
        assert "operator role" in refused.json()["error"]["message"]


def test_a_tenant_admin_does_not_hold_the_operator_role() -> None:
    admin = Principal("tenant-a", "alice", frozenset({"admin"}))
    assert admin.has_role("reviewer") and not admin.has_role("operator")
    assert not admin.is_operator
    assert Principal("ops", "p", frozenset({"operator"})).is_operator
