"""Each security-relevant action leaves exactly one audit row, scoped by tenant, no secrets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.auth import create_api_key, list_api_keys, revoke_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import serve, wait_for_event, wait_for_status
from tools.config import ToolConfig
from tools.spec import agent_tool

pytestmark = pytest.mark.timeout(180)


@agent_tool
async def page(message: str) -> str:
    """Page the on-call engineer.

    Args:
        message: What to tell them.
    """
    return "paged"


def _page_turns() -> list[ScriptedTurn]:
    call = ScriptedToolCall(id="p1", name="page", args={"message": "x"})
    return [ScriptedTurn(tool_calls=[call]), ScriptedTurn(text="Paged.")]


SCRIPTS = {"page": _page_turns()}


@dataclass
class Env:
    client: httpx.AsyncClient
    admin: dict[str, str]
    user: dict[str, str]
    stranger_admin: dict[str, str]
    operator: dict[str, str]


@pytest.fixture(scope="module")
async def env(settings: Settings, pool: Pool) -> AsyncIterator[Env]:
    config = ToolConfig.model_validate(
        {"tenants": {"acme": {"tools": {"page": {"approval": "always"}}}}}
    )
    custom = settings.model_copy(
        update={
            "auth_enabled": True,
            "tool_config": config,
            "mcp_api_allowed_hosts": ["crm.example.com"],
        }
    )
    app = create_app(custom, models=ModelRegistry(custom, SCRIPTS), tools=[page])

    async def bearer(tenant: str, user: str, roles: list[str]) -> dict[str, str]:
        return {"Authorization": f"Bearer {await create_api_key(pool, tenant, user, roles)}"}

    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield Env(
            client,
            await bearer("acme", "ann", ["admin", "reviewer"]),
            await bearer("acme", "bob", []),
            await bearer("globex", "gus", ["admin"]),
            await bearer("ops", "olga", ["operator"]),
        )


async def audit_rows(pool: Pool, action: str, target: str | None = None) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM audit_log WHERE action = %s AND (%s::text IS NULL OR target = %s)",
            (action, target, target),
        )
        return list(await cur.fetchall())


async def start_waiting_run(env: Env) -> dict[str, Any]:
    c = env.client
    conv = (await c.post("/api/conversations", json={}, headers=env.user)).json()
    response = await c.post(
        f"/api/conversations/{conv['conversationId']}/messages",
        json={"content": "page them", "model": "scripted:page"},
        headers=env.user,
    )
    assert response.status_code == 202, response.text
    run: dict[str, Any] = response.json()
    await wait_for_event(c, run["streamUrl"], "approval.required", headers=env.user)
    await wait_for_status(c, run["runId"], "waiting_user", headers=env.user)
    return run


async def test_keys_created_and_revoked_leave_one_row_each(pool: Pool) -> None:
    await create_api_key(pool, "keyco", "kim", ["reviewer"], "laptop", actor="olga")
    (key,) = [k for k in await list_api_keys(pool, "keyco")]
    assert await revoke_api_key(pool, key["id"], actor="olga")
    assert not await revoke_api_key(pool, key["id"], actor="olga")  # already revoked: no row

    (created,) = await audit_rows(pool, "key.created", key["id"])
    (revoked,) = await audit_rows(pool, "key.revoked", key["id"])
    assert created["tenant_id"] == "keyco" and created["actor"] == "olga"
    assert created["diff"] == {"user": "kim", "roles": ["reviewer"], "label": "laptop"}
    assert revoked["diff"] == {"user": "kim"}
    assert not any("ak_" in str(r["diff"]) for r in (created, revoked))


async def test_approval_pause_resume_and_cancel_leave_one_row_each(env: Env, pool: Pool) -> None:
    c = env.client
    decided = await start_waiting_run(env)
    rows = (await c.get(f"/api/runs/{decided['runId']}/approvals", headers=env.user)).json()
    approval = rows["approvals"][0]["approvalId"]
    answer = await c.post(
        f"/api/approvals/{approval}", json={"decision": "approve"}, headers=env.admin
    )
    assert answer.status_code == 200, answer.text
    await wait_for_status(c, decided["runId"], "completed", headers=env.user)
    (row,) = await audit_rows(pool, "approval.decided", approval)
    assert row["actor"] == "ann" and row["diff"]["decision"] == "approve"

    held = await start_waiting_run(env)
    run_id = held["runId"]
    assert (await c.post(f"/api/runs/{run_id}/pause", headers=env.admin)).status_code == 202
    assert (await c.post(f"/api/runs/{run_id}/pause", headers=env.admin)).status_code == 202
    assert (await c.post(f"/api/runs/{run_id}/resume", headers=env.admin)).status_code == 200
    assert (await c.post(f"/api/runs/{run_id}/cancel", headers=env.admin)).status_code == 202
    assert len(await audit_rows(pool, "run.pause_requested", run_id)) == 1  # the second: no-op
    assert len(await audit_rows(pool, "run.resumed", run_id)) == 1
    (cancel,) = await audit_rows(pool, "run.cancel_requested", run_id)
    assert cancel["actor"] == "ann" and cancel["tenant_id"] == "acme"


async def test_configuration_changes_leave_one_row_each_without_secrets(
    env: Env, pool: Pool
) -> None:
    c = env.client
    mcp = {
        "mcp_servers": {
            "crm": {
                "transport": "streamable_http",
                "url": "https://crm.example.com/mcp",
                "headers": {"Authorization": "Bearer s3cr3t-token"},
            }
        }
    }
    answer = await c.put("/api/tools/config", json={"allow": ["page"]}, headers=env.admin)
    assert answer.status_code == 200, answer.text
    answer = await c.put("/api/tools/config", json={"allow": ["page"], **mcp}, headers=env.admin)
    assert answer.status_code == 200, answer.text
    first, second = await audit_rows(pool, "tool_config.changed", "tools:acme")
    assert first["diff"] == {"allow": {"from": None, "to": "<1 items>"}}
    assert second["diff"]["mcp_servers.crm.headers"] == {"from": "[redacted]", "to": "[redacted]"}
    assert "s3cr3t" not in str(second["diff"])

    profile = {"name": "helper", "instructions": "Be brief.", "model": "scripted:page"}
    assert (await c.post("/api/agents", json=profile, headers=env.admin)).status_code == 201
    updated = {"instructions": "Be very brief.", "model": "scripted:page"}
    assert (await c.put("/api/agents/helper", json=updated, headers=env.admin)).status_code == 200
    assert (await c.delete("/api/agents/helper", headers=env.admin)).status_code == 204
    for action in ("agent.created", "agent.updated", "agent.deleted"):
        assert len(await audit_rows(pool, action, "agent:helper")) == 1, action
    (update,) = await audit_rows(pool, "agent.updated", "agent:helper")
    assert update["diff"]["instructions"] == {"from": "Be brief.", "to": "Be very brief."}

    answer = await c.put("/api/retention", json={"eventsDays": 3}, headers=env.admin)
    assert answer.status_code == 200, answer.text
    assert answer.json()["effective"]["eventsDays"] == 3
    (retention,) = await audit_rows(pool, "retention.changed", "retention:acme")
    assert retention["diff"] == {"eventsDays": {"from": None, "to": 3}}

    skill_md = "---\nname: house-style\ndescription: Write in the house style.\n---\nBe plain.\n"
    for _ in range(2):  # the same content again is no new version, and no new row
        answer = await c.post("/api/skills", json={"skillMd": skill_md}, headers=env.admin)
        assert answer.status_code in (200, 201), answer.text
    assert (await c.post("/api/skills/house-style/disable", headers=env.admin)).status_code == 200
    enabled = await c.post("/api/skills/house-style/enable", json={"version": 1}, headers=env.admin)
    assert enabled.status_code == 200, enabled.text
    for action in ("skill.uploaded", "skill.disabled", "skill.enabled"):
        assert len(await audit_rows(pool, action, "skill:house-style")) == 1, action


async def test_the_audit_log_is_read_by_admins_of_their_tenant_and_operators(env: Env) -> None:
    c = env.client
    await c.put("/api/retention", json={"spansDays": 5}, headers=env.stranger_admin)
    mine = (await c.get("/api/audit", headers=env.admin)).json()["entries"]
    assert mine and {e["tenantId"] for e in mine} == {"acme"}
    theirs = (await c.get("/api/audit", headers=env.stranger_admin)).json()["entries"]
    assert {e["tenantId"] for e in theirs} == {"globex"}
    assert (await c.get("/api/audit", headers=env.user)).status_code == 403
    peek = await c.get("/api/audit", params={"tenant": "acme"}, headers=env.stranger_admin)
    assert peek.status_code == 403
    everyone = (await c.get("/api/audit", params={"limit": 1000}, headers=env.operator)).json()
    assert {"acme", "globex"} <= {e["tenantId"] for e in everyone["entries"]}
    filtered = await c.get(
        "/api/audit", params={"tenant": "acme", "action": "agent"}, headers=env.operator
    )
    assert {e["action"] for e in filtered.json()["entries"]} == {
        "agent.created",
        "agent.updated",
        "agent.deleted",
    }
    first = (await c.get("/api/audit", params={"limit": 1}, headers=env.admin)).json()
    second = await c.get(
        "/api/audit", params={"limit": 1, "cursor": first["nextCursor"]}, headers=env.admin
    )
    assert int(second.json()["entries"][0]["id"]) < int(first["entries"][0]["id"])


async def test_audit_rows_cannot_be_changed(pool: Pool) -> None:
    async with pool.connection() as conn:
        with pytest.raises(Exception, match="append-only"):
            await conn.execute("UPDATE audit_log SET actor = 'mallory'")
