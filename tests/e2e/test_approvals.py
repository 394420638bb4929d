"""High-risk tool calls pause the run for a reviewer of the same tenant."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from langchain_core.messages import ToolMessage

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve, wait_for_event, wait_for_status
from tools.config import ToolConfig
from tools.spec import CallContext, agent_tool

OUTBOX: list[dict[str, Any]] = []


@agent_tool(risk="high", permissions={"email:send"}, idempotent=False, dedupes=True)
async def send_email(to: str, subject: str, call: CallContext) -> str:
    """Send an email to someone.

    Args:
        to: The recipient's address.
        subject: The subject line.
    """
    OUTBOX.append({"to": to, "subject": subject, "key": call.idempotency_key})
    return f"sent to {to}"


@agent_tool
async def page(message: str) -> str:
    """Page the on-call engineer.

    Args:
        message: What to tell them.
    """
    OUTBOX.append({"page": message})
    return "paged"


def email(n: int) -> ScriptedToolCall:
    return ScriptedToolCall(
        id=f"e{n}", name="send_email", args={"to": f"x{n}@example.com", "subject": "hi"}
    )


SCRIPTS = {
    "email": [ScriptedTurn(tool_calls=[email(1)]), ScriptedTurn(text="Done.")],
    "two": [ScriptedTurn(tool_calls=[email(1), email(2)]), ScriptedTurn(text="Both done.")],
    "page": [
        ScriptedTurn(tool_calls=[ScriptedToolCall(id="p1", name="page", args={"message": "x"})]),
        ScriptedTurn(text="Paged."),
    ],
}


@dataclass
class Env:
    app: FastAPI
    client: httpx.AsyncClient
    user: dict[str, str]
    reviewer: dict[str, str]
    stranger: dict[str, str]


@pytest.fixture(scope="module")
async def env(settings: Settings, pool: Pool) -> AsyncIterator[Env]:
    config = ToolConfig.model_validate(
        {
            "tenants": {
                "acme": {
                    "grants": {"*": ["email:send"]},
                    "tools": {"page": {"approval": "always", "approval_timeout_s": 0.5}},
                }
            }
        }
    )
    custom = settings.model_copy(update={"auth_enabled": True, "tool_config": config})
    app = create_app(custom, models=ModelRegistry(custom, SCRIPTS), tools=[send_email, page])

    async def bearer(tenant: str, user: str, roles: list[str]) -> dict[str, str]:
        return {"Authorization": f"Bearer {await create_api_key(pool, tenant, user, roles)}"}

    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield Env(
            app,
            client,
            await bearer("acme", "alice", []),
            await bearer("acme", "rita", ["reviewer"]),
            await bearer("globex", "greg", ["reviewer"]),
        )


async def start(env: Env, script: str) -> dict[str, Any]:
    c = env.client
    conv = (await c.post("/api/conversations", json={}, headers=env.user)).json()
    response = await c.post(
        f"/api/conversations/{conv['conversationId']}/messages",
        json={"content": "please", "model": f"scripted:{script}"},
        headers=env.user,
    )
    assert response.status_code == 202, response.text
    run: dict[str, Any] = response.json()
    await wait_for_event(c, run["streamUrl"], "approval.required", headers=env.user)
    await wait_for_status(c, run["runId"], "waiting_user", headers=env.user)
    return run


async def pending(env: Env, run_id: str) -> list[dict[str, Any]]:
    rows = (await env.client.get(f"/api/runs/{run_id}/approvals", headers=env.user)).json()
    return [a for a in rows["approvals"] if a["status"] == "pending"]


async def decide(
    env: Env, approval_id: str, headers: dict[str, str], **body: Any
) -> httpx.Response:
    return await env.client.post(f"/api/approvals/{approval_id}", json=body, headers=headers)


async def test_a_high_risk_call_waits_for_a_reviewer_then_runs(env: Env, pool: Pool) -> None:
    before = len(OUTBOX)
    run = await start(env, "email")
    (approval,) = await pending(env, run["runId"])
    assert approval["tool"] == "send_email" and approval["risk"] == "high"
    assert approval["args"] == {"to": "x1@example.com", "subject": "hi"}
    assert "high-risk" in approval["reason"]
    assert len(OUTBOX) == before

    # Nothing is held while waiting: no lease, no worker task.
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT lease_owner FROM runs WHERE id = %s", (run["runId"],))
        assert (await cur.fetchone())["lease_owner"] is None  # type: ignore[index]
    async with asyncio.timeout(60):  # the worker lets go just after it parks the run
        while run["runId"] in env.app.state.worker.active_runs:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    listed = (await env.client.get("/api/approvals?status=pending", headers=env.reviewer)).json()
    assert approval["approvalId"] in [a["approvalId"] for a in listed["approvals"]]
    assert (await env.client.get("/api/approvals", headers=env.user)).status_code == 403
    assert (
        await decide(env, approval["approvalId"], env.user, decision="approve")
    ).status_code == 403
    assert (
        await decide(env, approval["approvalId"], env.stranger, decision="approve")
    ).status_code == 404

    response = await decide(env, approval["approvalId"], env.reviewer, decision="approve")
    assert response.status_code == 200, response.text
    assert response.json()["decision"]["by"] == "rita"
    again = await decide(env, approval["approvalId"], env.reviewer, decision="reject", reason="x")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_decided"

    events = await read_sse(env.client, run["streamUrl"], headers=env.user)
    assert events[-1].event == "run.completed"
    types = [e.event for e in events]
    assert (
        types.index("approval.required")
        < types.index("approval.resolved")
        < types.index("tool.completed")
    )
    resolved = next(e for e in events if e.event == "approval.resolved").data["data"]
    assert resolved["by"] == "rita" and resolved["decision"] == "approve"
    assert OUTBOX[before:] == [
        {"to": "x1@example.com", "subject": "hi", "key": OUTBOX[before]["key"]}
    ]


async def test_a_rejection_reason_reaches_the_model(env: Env) -> None:
    before = len(OUTBOX)
    run = await start(env, "email")
    (approval,) = await pending(env, run["runId"])
    no_reason = await decide(env, approval["approvalId"], env.reviewer, decision="reject")
    assert no_reason.status_code == 422
    response = await decide(
        env, approval["approvalId"], env.reviewer, decision="reject", reason="not to customers"
    )
    assert response.status_code == 200
    events = await read_sse(env.client, run["streamUrl"], headers=env.user)
    failed = next(e for e in events if e.event == "tool.failed").data["data"]
    assert failed["errorType"] == "rejected" and "not to customers" in failed["error"]
    assert events[-1].event == "run.completed"
    assert len(OUTBOX) == before
    state = await env.app.state.graph.aget_state(
        {"configurable": {"thread_id": run["conversationId"]}}
    )
    message = next(m for m in state.values["messages"] if isinstance(m, ToolMessage))
    assert "rita rejected this call: not to customers" in str(message.content)


async def test_an_edit_runs_the_call_with_validated_new_arguments(env: Env) -> None:
    run = await start(env, "email")
    (approval,) = await pending(env, run["runId"])
    invalid = await decide(
        env, approval["approvalId"], env.reviewer, decision="edit", args={"to": "a@b.c"}
    )
    assert invalid.status_code == 422 and "subject" in invalid.json()["error"]["message"]
    edited = {"to": "boss@example.com", "subject": "reviewed"}
    response = await decide(env, approval["approvalId"], env.reviewer, decision="edit", args=edited)
    assert response.status_code == 200
    assert response.json()["status"] == "edited"
    events = await read_sse(env.client, run["streamUrl"], headers=env.user)
    assert events[-1].event == "run.completed"
    assert OUTBOX[-1]["to"] == "boss@example.com" and OUTBOX[-1]["subject"] == "reviewed"


async def test_the_run_waits_until_every_pending_call_is_decided(env: Env) -> None:
    run = await start(env, "two")
    by_call = {a["toolCallId"]: a for a in await pending(env, run["runId"])}
    first, second = by_call["e1"], by_call["e2"]
    await decide(env, first["approvalId"], env.reviewer, decision="approve")
    snapshot = (await env.client.get(run["snapshotUrl"], headers=env.user)).json()
    assert snapshot["status"] == "waiting_user"
    assert {a["toolCallId"]: a["status"] for a in snapshot["approvals"]} == {
        "e1": "approved",
        "e2": "pending",
    }
    await decide(env, second["approvalId"], env.reviewer, decision="reject", reason="one is enough")
    events = await read_sse(env.client, run["streamUrl"], headers=env.user)
    assert events[-1].event == "run.completed"
    outcomes = {
        e.data["data"]["toolCallId"]: e.event for e in events if e.event.startswith("tool.")
    }
    assert outcomes == {"e1": "tool.completed", "e2": "tool.failed"}


async def test_cancelling_a_waiting_run_closes_its_approvals(env: Env) -> None:
    run = await start(env, "email")
    (approval,) = await pending(env, run["runId"])
    cancelled = await env.client.post(f"/api/runs/{run['runId']}/cancel", headers=env.user)
    assert cancelled.json()["status"] == "cancelled"
    row = (
        await env.client.get(f"/api/approvals/{approval['approvalId']}", headers=env.user)
    ).json()
    assert row["status"] == "cancelled"
    late = await decide(env, approval["approvalId"], env.reviewer, decision="approve")
    assert late.status_code == 409

    # The conversation goes on; the cancelled call gets an error result before the new message.
    response = await env.client.post(
        f"/api/conversations/{run['conversationId']}/messages",
        json={"content": "never mind", "model": "scripted:page"},
        headers=env.user,
    )
    follow_up = response.json()
    await wait_for_event(env.client, follow_up["streamUrl"], "approval.required", headers=env.user)
    state = await env.app.state.graph.aget_state(
        {"configurable": {"thread_id": run["conversationId"]}}
    )
    closed = [m for m in state.values["messages"] if isinstance(m, ToolMessage)]
    assert closed[0].tool_call_id == "e1" and "cancelled" in str(closed[0].content)
    await env.client.post(f"/api/runs/{follow_up['runId']}/cancel", headers=env.user)


async def test_an_unanswered_approval_expires_as_a_rejection(env: Env) -> None:
    run = await start(env, "page")
    (approval,) = await pending(env, run["runId"])
    assert approval["expiresAt"] is not None
    events = await read_sse(env.client, run["streamUrl"], headers=env.user)
    assert events[-1].event == "run.completed"
    failed = next(e for e in events if e.event == "tool.failed").data["data"]
    assert failed["errorType"] == "rejected" and "expired" in failed["error"]
    row = (
        await env.client.get(f"/api/approvals/{approval['approvalId']}", headers=env.user)
    ).json()
    assert row["status"] == "expired" and row["decision"]["by"] == "system"
