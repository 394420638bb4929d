"""Usage data is scoped by tenant, and by user unless the caller holds the billing role."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import ModelPrice, Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve

PRICE = ModelPrice(input_per_mtok=Decimal("3"), output_per_mtok=Decimal("15"))


@pytest.fixture(scope="module")
async def base_url(settings: Settings, pool: Pool) -> AsyncIterator[str]:
    secured = settings.model_copy(
        update={"auth_enabled": True, "model_prices": {"scripted:hello": PRICE}}
    )
    scripts = {
        "hello": [
            ScriptedTurn(
                text="hi", usage={"input_tokens": 1000, "output_tokens": 100, "total_tokens": 1100}
            )
        ]
    }
    async with serve(create_app(secured, models=ModelRegistry(secured, scripts))) as url:
        yield url


async def client_for(
    base_url: str, pool: Pool, tenant: str, user: str, roles: list[str]
) -> httpx.AsyncClient:
    key = await create_api_key(pool, tenant, user, roles)
    return httpx.AsyncClient(
        base_url=base_url, timeout=30, headers={"Authorization": f"Bearer {key}"}
    )


async def run_once(client: httpx.AsyncClient) -> str:
    conv = (await client.post("/api/conversations", json={})).json()
    accepted = (
        await client.post(
            f"/api/conversations/{conv['conversationId']}/messages",
            json={"content": "hi", "model": "scripted:hello"},
        )
    ).json()
    events = await read_sse(client, accepted["streamUrl"])
    assert events[-1].event == "run.completed"
    return str(accepted["runId"])


async def test_usage_is_scoped_by_tenant_and_by_user_without_billing_role(
    base_url: str, pool: Pool
) -> None:
    alice = await client_for(base_url, pool, "acme", "alice", [])
    bob = await client_for(base_url, pool, "acme", "bob", [])
    billing = await client_for(base_url, pool, "acme", "carol", ["billing"])
    stranger = await client_for(base_url, pool, "globex", "eve", ["admin"])
    async with alice, bob, billing, stranger:
        run_a = await run_once(alice)
        await run_once(bob)
        await run_once(bob)

        usage = (await alice.get(f"/api/runs/{run_a}/usage")).json()
        # 1000 input at 3/M + 100 output at 15/M
        assert usage["totals"]["cost"] == "0.0045"
        assert (await stranger.get(f"/api/runs/{run_a}/usage")).status_code == 404

        mine = (await alice.get("/api/usage", params={"groupBy": "user"})).json()
        assert [(d["userId"], d["runs"]) for d in mine["days"]] == [("alice", 1)]
        refused = await alice.get("/api/usage", params={"userId": "bob"})
        assert refused.status_code == 403

        everyone = (await billing.get("/api/usage", params={"groupBy": "user"})).json()
        assert [(d["userId"], d["runs"]) for d in everyone["days"]] == [
            ("alice", 1),
            ("bob", 2),
        ]
        tenant = (await billing.get("/api/usage")).json()["days"]
        assert tenant[0]["tenantId"] == "acme" and tenant[0]["cost"] == "0.0135"

        assert (await stranger.get("/api/usage")).json()["days"] == []
