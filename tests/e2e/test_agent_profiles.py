"""Agent profiles: versions pinned by runs, tenants kept apart, clear 4xx, files synced."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from graphs.context import DEFAULT_SYSTEM_PROMPT
from server.agents.files import AgentFileError, sync_agent_files, sync_agents
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.errors import StartupError
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.fake_openai import FakeOpenAI, FakeToolCall, Reply
from tests.support.live import read_sse, serve, wait_for_event, wait_for_status

pytestmark = pytest.mark.timeout(120)

SUPPORT = {
    "name": "support",
    "instructions": "V1: you are Acme's support agent.",
    "model": "openai:gpt-4o-mini",
    "tools": ["calculator"],
    "toolPolicies": {"calculator": {"approval": "always"}},
}


@pytest.fixture(scope="module")
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
async def base_url(settings: Settings, fake: FakeOpenAI) -> AsyncIterator[str]:
    secured = settings.model_copy(
        update={
            "auth_enabled": True,
            "openai_api_key": SecretStr("test-key"),
            "openai_base_url": fake.url,
            "model_ttft_timeout_s": 30.0,
        }
    )
    async with serve(create_app(secured, models=ModelRegistry(secured))) as url:
        yield url


@pytest.fixture(scope="module")
async def keys(pool: Pool, base_url: str) -> dict[str, str]:
    return {
        "admin": await create_api_key(pool, "acme", "ada", ["admin"]),
        "user": await create_api_key(pool, "acme", "bob", []),
        "other": await create_api_key(pool, "globex", "gil", ["admin"]),
    }


def client_for(base_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


@pytest.fixture
async def admin(base_url: str, keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(base_url, keys["admin"]) as c:
        yield c


@pytest.fixture
async def user(base_url: str, keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(base_url, keys["user"]) as c:
        yield c


@pytest.fixture
async def other(base_url: str, keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(base_url, keys["other"]) as c:
        yield c


async def post(client: httpx.AsyncClient, content: str, **body: Any) -> httpx.Response:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    return await client.post(
        f"/api/conversations/{conv}/messages", json={"content": content, **body}
    )


def system_prompt(fake: FakeOpenAI, marker: str) -> str:
    """The system prompt of the request whose last user message is `marker`."""
    for served in reversed(fake.served):
        users = [m for m in served.body["messages"] if m["role"] == "user"]
        if users and users[-1]["content"] == marker:
            return str(served.body["messages"][0]["content"])
    raise AssertionError(f"no request for {marker!r}")


async def test_a_profile_change_takes_effect_for_new_runs_only(
    admin: httpx.AsyncClient, user: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    created = await admin.post("/api/agents", json=SUPPORT)
    assert created.status_code == 201, created.text
    assert created.json()["ref"] == "support@1"

    # Run A uses version 1 and stops for approval of its calculator call (the profile's
    # tool policy), so it is still in progress when the profile changes.
    fake.script(
        "gpt-4o-mini",
        Reply(text="", tool_calls=[FakeToolCall("calculator", {"expression": "6*7"})]),
        Reply(text="A is done"),
    )
    response = await post(user, "run A", agent="support")
    assert response.status_code == 202, response.text
    run_a = response.json()
    assert run_a["agent"] == {"name": "support", "version": 1}
    await wait_for_event(user, run_a["streamUrl"], "approval.required")
    await wait_for_status(user, run_a["runId"], "waiting_user")

    changed = {**SUPPORT, "instructions": "V2: you are Acme's new support agent."}
    del changed["name"]
    updated = await admin.put("/api/agents/support", json=changed)
    assert updated.status_code == 200 and updated.json()["version"] == 2
    same = await admin.put("/api/agents/support", json=changed)
    assert same.json()["version"] == 2 and same.headers["Agent-Version-Created"] == "false"

    fake.script("gpt-4o-mini", Reply(text="B is done"))
    run_b = (await post(user, "run B", agent="support")).json()
    assert run_b["agent"] == {"name": "support", "version": 2}
    events = await read_sse(user, run_b["streamUrl"])
    assert events[-1].event == "run.completed"
    assert system_prompt(fake, "run B").startswith("V2:")

    [approval] = (await user.get(f"/api/runs/{run_a['runId']}/approvals")).json()["approvals"]
    decided = await admin.post(
        f"/api/approvals/{approval['approvalId']}", json={"decision": "approve"}
    )
    assert decided.status_code == 200, decided.text
    events = await read_sse(user, run_a["streamUrl"])
    assert events[-1].event == "run.completed", events[-1].data
    assert system_prompt(fake, "run A").startswith("V1:")  # its second call, after the change
    record = (await user.get(f"/api/runs/{run_a['runId']}")).json()
    assert record["agent"] == {"name": "support", "version": 1}
    created_event = next(e for e in events if e.event == "run.created")
    assert created_event.data["data"]["agent"] == "support@1"

    # A pinned version still runs after newer ones exist.
    fake.script("gpt-4o-mini", Reply(text="pinned"))
    pinned = (await post(user, "run C", agent="support@1")).json()
    await read_sse(user, pinned["streamUrl"])
    assert system_prompt(fake, "run C").startswith("V1:")
    versions = (await user.get("/api/agents/support/versions")).json()["versions"]
    assert [v["version"] for v in versions] == [2, 1]


async def test_unknown_or_foreign_profiles_get_a_clear_4xx(
    admin: httpx.AsyncClient, other: httpx.AsyncClient, user: httpx.AsyncClient
) -> None:
    if (await admin.get("/api/agents/support")).status_code == 404:
        assert (await admin.post("/api/agents", json=SUPPORT)).status_code == 201

    for client, ref in ((other, "support"), (user, "nobody"), (user, "support@99")):
        response = await post(client, "hi", agent=ref)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "unknown_agent"
        assert "does not exist for your tenant" in error["message"]
        assert "GET /api/agents" in error["message"]
    bad = await post(user, "hi", agent="Support!")
    assert bad.status_code == 422 and "support@3" in bad.json()["error"]["message"]

    conversation = await other.post("/api/conversations", json={"agent": "support"})
    assert conversation.status_code == 422
    assert conversation.json()["error"]["code"] == "unknown_agent"
    missing = await other.get("/api/agents/support")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "agent_not_found"
    names = [a["name"] for a in (await other.get("/api/agents")).json()["agents"]]
    assert names == ["default"]

    forbidden = await user.post("/api/agents", json={**SUPPORT, "name": "sales"})
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    taken = await admin.post("/api/agents", json=SUPPORT)
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "agent_exists"
    bad_model = await admin.post("/api/agents", json={**SUPPORT, "name": "x", "model": "nope"})
    assert bad_model.status_code == 400
    bad_field = await admin.post("/api/agents", json={**SUPPORT, "name": "x", "maxStep": 3})
    assert bad_field.status_code == 422 and "maxStep" in bad_field.json()["error"]["message"]


async def test_the_default_profile_reproduces_the_servers_behaviour(
    user: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    agents = (await user.get("/api/agents")).json()["agents"]
    default = next(a for a in agents if a["name"] == "default")
    assert default["version"] == 0 and default["source"] == "builtin"
    fake.script("gpt-4o-mini", Reply(text="plain"))
    run = (await post(user, "run D", model="openai:gpt-4o-mini")).json()
    assert run["agent"] == {"name": "default", "version": 0}
    await read_sse(user, run["streamUrl"])
    assert system_prompt(fake, "run D").startswith(DEFAULT_SYSTEM_PROMPT)


async def test_a_deleted_profile_refuses_new_runs_and_past_runs_keep_their_version(
    admin: httpx.AsyncClient, user: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    body = {**SUPPORT, "name": "temp", "toolPolicies": {}}
    assert (await admin.post("/api/agents", json=body)).status_code == 201
    fake.script("gpt-4o-mini", Reply(text="before delete"))
    run = (await post(user, "run E", agent="temp")).json()
    await read_sse(user, run["streamUrl"])
    assert (await admin.delete("/api/agents/temp")).status_code == 204
    refused = await post(user, "hi", agent="temp")
    assert refused.status_code == 422
    past = (await user.get(f"/api/runs/{run['runId']}")).json()
    assert past["agent"] == {"name": "temp", "version": 1}
    again = await admin.post("/api/agents", json=body)
    assert again.json()["version"] == 2  # numbers are never reused


async def test_profiles_declared_in_files_are_synced_and_read_only_through_the_api(
    pool: Pool, admin: httpx.AsyncClient, tmp_path: Path
) -> None:
    folder = tmp_path / "agents"
    folder.mkdir()
    path = folder / "billing.yaml"
    path.write_text(
        "name: billing\ntenants: [acme]\ninstructions: Billing questions only.\n"
        "context:\n  budgets: {history: 4000}\n  summary: {enabled: true, maxTokens: 300}\n"
    )
    assert await sync_agent_files(pool, folder, "default") == ["acme/billing@1"]
    assert await sync_agent_files(pool, folder, "default") == []  # unchanged: no version
    path.write_text(path.read_text().replace("only", "and refunds"))
    assert await sync_agent_files(pool, folder, "default") == ["acme/billing@2"]

    found = (await admin.get("/api/agents/billing")).json()
    assert found["source"] == "file" and found["sourcePath"] == str(path)
    assert found["spec"]["context"]["summary"]["maxTokens"] == 300
    refused = await admin.put("/api/agents/billing", json={"instructions": "changed"})
    assert refused.status_code == 409 and str(path) in refused.json()["error"]["message"]

    (folder / "broken.yaml").write_text("name: broken\nmaxSteps: many\n")
    with pytest.raises(AgentFileError, match=r"broken.yaml: invalid profile: maxSteps"):
        await sync_agent_files(pool, folder, "default")
    settings = Settings(_env_file=None, agents_dir=folder)  # type: ignore[call-arg]
    with pytest.raises(StartupError, match="agent profile file refused"):
        await sync_agents(pool, settings)


async def test_a_message_without_an_agent_runs_its_conversations_profile(
    admin: httpx.AsyncClient, user: httpx.AsyncClient
) -> None:
    if (await admin.get("/api/agents/support")).status_code == 404:
        assert (await admin.post("/api/agents", json=SUPPORT)).status_code == 201
    latest = (await admin.get("/api/agents/support")).json()["version"]
    conv = (await user.post("/api/conversations", json={"agent": "support"})).json()
    url = f"/api/conversations/{conv['conversationId']}/messages"
    # No agent in the message: the conversation's, not the default one read in advance.
    named = await user.post(url, json={"content": "hi", "options": {"maxSteps": 1}})
    assert named.status_code == 202, named.text
    assert named.json()["agent"] == {"name": "support", "version": latest}
    # An agent in the message wins over the conversation's.
    other = await user.post(url, json={"content": "hi", "agent": "default", "ifBusy": "enqueue"})
    assert other.status_code == 202, other.text
    assert other.json()["agent"] == {"name": "default", "version": 0}
    for run in (named.json(), other.json()):
        await user.post(f"/api/runs/{run['runId']}/cancel")


async def test_a_missing_conversation_is_a_404_even_when_the_agent_is_unknown_too(
    user: httpx.AsyncClient,
) -> None:
    response = await user.post(
        "/api/conversations/conv_missing/messages", json={"content": "hi", "agent": "nobody"}
    )
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "not_found"
