"""Operator pause and resume over HTTP, with the app's real worker and a real Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.client.commands import cmd_runs
from server.client.errors import ClientError
from server.client.follow import ClientConfig
from server.client.parser import build_parser
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import SseEvent, read_sse, rebuild_output, serve, wait_for_status
from tests.support.tools import bump_counter, launch_rocket

pytestmark = pytest.mark.timeout(120)

PREAMBLE = "Counting the visitors now, one moment please."


def scripts(counter: Path) -> dict[str, list[ScriptedTurn]]:
    bump = ScriptedToolCall(id="b1", name="bump_counter", args={"path": str(counter)})
    return {
        # Streams slowly, so a pause sent while it streams lands before the tool step.
        "count": [
            ScriptedTurn(text=PREAMBLE, chunk_chars=1, delay_s=0.05, tool_calls=[bump]),
            ScriptedTurn(text="Counted once."),
        ],
        "quick": [ScriptedTurn(text="Hi.")],
        "rocket": [
            ScriptedTurn(
                tool_calls=[
                    ScriptedToolCall(id="r1", name="launch_rocket", args={"target": "moon"})
                ]
            ),
            ScriptedTurn(text="Launched."),
        ],
    }


@dataclass
class Env:
    app: FastAPI
    client: httpx.AsyncClient
    counter: Path
    alice: dict[str, str]  # owner of the runs
    bob: dict[str, str]  # same tenant, no role
    boss: dict[str, str]  # tenant admin
    rita: dict[str, str]  # reviewer
    greg: dict[str, str]  # another tenant's admin
    ivan: dict[str, str]  # a tenant limited to one run per user


@pytest.fixture(scope="module")
async def env(
    settings: Settings, pool: Pool, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    counter = tmp_path_factory.mktemp("pause") / "counter"
    custom = settings.model_copy(
        update={
            "auth_enabled": True,
            "worker_concurrency": 1,
            "lease_seconds": 2.0,
            "worker_poll_seconds": 0.5,
            "limit_policy": "reject",
            "tenant_limits": {"initech": {"userMaxActiveRuns": 1}},
        }
    )
    app = create_app(
        custom,
        models=ModelRegistry(custom, scripts(counter)),
        tools=[bump_counter, launch_rocket],
    )

    async def bearer(tenant: str, user: str, roles: list[str]) -> dict[str, str]:
        return {"Authorization": f"Bearer {await create_api_key(pool, tenant, user, roles)}"}

    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield Env(
            app,
            client,
            counter,
            await bearer("acme", "alice", []),
            await bearer("acme", "bob", []),
            await bearer("acme", "boss", ["admin"]),
            await bearer("acme", "rita", ["reviewer"]),
            await bearer("globex", "greg", ["admin"]),
            await bearer("initech", "ivan", []),
        )


async def conversation(env: Env, who: dict[str, str]) -> str:
    response = await env.client.post("/api/conversations", json={}, headers=who)
    return str(response.json()["conversationId"])


async def post(
    env: Env, script: str, conv: str | None = None, who: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    who = who or env.alice
    conv = conv or await conversation(env, who)
    return await env.client.post(
        f"/api/conversations/{conv}/messages",
        json={"content": "go", "model": f"scripted:{script}", **body},
        headers=who,
    )


async def start(env: Env, script: str, **kwargs: Any) -> dict[str, Any]:
    response = await post(env, script, **kwargs)
    assert response.status_code == 202, response.text
    return dict(response.json())


async def control(env: Env, run_id: str, action: str, who: dict[str, str]) -> httpx.Response:
    return await env.client.post(f"/api/runs/{run_id}/{action}", headers=who)


async def snapshot_when(env: Env, run_id: str, predicate: Any) -> dict[str, Any]:
    async with asyncio.timeout(60):
        while True:
            snap = (await env.client.get(f"/api/runs/{run_id}/snapshot", headers=env.alice)).json()
            if predicate(snap):
                return dict(snap)
            await asyncio.sleep(0.01)


async def finished(env: Env, run: dict[str, Any], who: dict[str, str]) -> list[SseEvent]:
    """Read the whole stream and check that log, snapshot and stored answer agree."""
    async with asyncio.timeout(60):
        events = await read_sse(env.client, run["streamUrl"], headers=who)
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert events[-1].event == "run.completed", [e.event for e in events]
    created = [e.data["data"]["itemId"] for e in events if e.event == "message.item.created"]
    assert len(created) == len(set(created)), created
    snap = (await env.client.get(f"/api/runs/{run['runId']}/snapshot", headers=who)).json()
    conv = run["conversationId"]
    messages = (await env.client.get(f"/api/conversations/{conv}/messages", headers=who)).json()
    assert rebuild_output(events) == snap["output"] == messages["messages"][-1]["content"]
    return events


def kinds(events: list[SseEvent]) -> list[str]:
    return [e.event for e in events]


async def test_pause_stops_a_running_run_at_its_next_step_and_frees_its_worker(env: Env) -> None:
    env.counter.unlink(missing_ok=True)
    run = await start(env, "count")
    run_id = run["runId"]
    await snapshot_when(env, run_id, lambda s: s["items"] and s["items"][0]["text"])

    response = await control(env, run_id, "pause", env.alice)
    assert response.status_code == 202, response.text
    assert response.json()["status"] in ("running", "paused")

    record = await wait_for_status(env.client, run_id, "paused", headers=env.alice)
    assert record["leaseOwner"] is None and record["pausedAt"] is not None
    assert record["pauseRequested"] is False
    worker = env.app.state.runtime.worker
    # The worker lets go of the run just after it records the pause.
    async with asyncio.timeout(60):
        while run_id in worker.active_runs:  # noqa: ASYNC110 (the worker's in-memory slots)
            await asyncio.sleep(0.05)
    assert not env.counter.exists()  # stopped after the model turn, before its tool

    # The only worker slot is free: another run completes while this one stays paused.
    other = await start(env, "quick")
    await finished(env, other, env.alice)
    assert (await env.client.get(f"/api/runs/{run_id}", headers=env.alice)).json()[
        "status"
    ] == "paused"

    response = await control(env, run_id, "resume", env.alice)
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("queued", "running", "completed")
    events = await finished(env, run, env.alice)
    assert rebuild_output(events) == PREAMBLE + "\n\nCounted once."
    k = kinds(events)
    assert k.count("run.paused") == 1 and k.count("run.resumed") == 1
    assert k.count("run.started") == 2 and k.count("tool.started") == 1
    assert k.index("run.paused") < k.index("run.resumed") < k.index("tool.started")
    assert len(env.counter.read_text().splitlines()) == 1
    assert "run.requeued" not in k  # a pause is not a recovery
    paused = next(e for e in events if e.event == "run.paused")
    assert paused.data["data"]["from"] == "running"


async def test_a_run_paused_while_waiting_keeps_the_decision_made_meanwhile(env: Env) -> None:
    run = await start(env, "rocket")
    run_id = run["runId"]
    await wait_for_status(env.client, run_id, "waiting_user", headers=env.alice)

    response = await control(env, run_id, "pause", env.alice)
    assert response.status_code == 202, response.text
    assert response.json()["paused"] is True and response.json()["status"] == "paused"
    approvals = (await env.client.get(f"/api/runs/{run_id}/approvals", headers=env.alice)).json()
    (approval,) = approvals["approvals"]
    assert approval["status"] == "pending"

    decided = await env.client.post(
        f"/api/approvals/{approval['approvalId']}", json={"decision": "approve"}, headers=env.rita
    )
    assert decided.status_code == 200, decided.text
    record = (await env.client.get(f"/api/runs/{run_id}", headers=env.alice)).json()
    assert record["status"] == "paused"  # a decision does not resume a paused run

    assert (await control(env, run_id, "resume", env.alice)).status_code == 200
    events = await finished(env, run, env.alice)
    k = kinds(events)
    assert k.index("run.paused") < k.index("approval.resolved") < k.index("run.resumed")
    assert k.count("tool.completed") == 1 and rebuild_output(events) == "Launched."


async def test_a_run_paused_while_waiting_resumes_to_waiting_for_its_reviewer(env: Env) -> None:
    run = await start(env, "rocket")
    run_id = run["runId"]
    await wait_for_status(env.client, run_id, "waiting_user", headers=env.alice)
    assert (await control(env, run_id, "pause", env.boss)).status_code == 202

    response = await control(env, run_id, "resume", env.boss)
    assert response.status_code == 200 and response.json()["status"] == "waiting_user"
    (approval,) = (await env.client.get(f"/api/runs/{run_id}/approvals", headers=env.alice)).json()[
        "approvals"
    ]
    assert approval["status"] == "pending"
    await env.client.post(
        f"/api/approvals/{approval['approvalId']}", json={"decision": "approve"}, headers=env.rita
    )
    await finished(env, run, env.alice)


async def test_a_paused_run_holds_its_conversation_and_a_queued_run_pauses_at_once(
    env: Env,
) -> None:
    conv = await conversation(env, env.alice)
    first = await start(env, "rocket", conv=conv)
    await wait_for_status(env.client, first["runId"], "waiting_user", headers=env.alice)
    assert (await control(env, first["runId"], "pause", env.alice)).status_code == 202

    busy = await post(env, "quick", conv=conv, ifBusy="reject")
    assert busy.status_code == 409, busy.text
    assert busy.json()["error"]["code"] == "conversation_busy"
    assert busy.json()["error"]["runId"] == first["runId"]

    second = await start(env, "quick", conv=conv, ifBusy="enqueue")
    response = await control(env, second["runId"], "pause", env.alice)
    assert response.status_code == 202 and response.json()["status"] == "paused"
    events = await read_sse(env.client, second["streamUrl"], headers=env.alice, stop_after=2)
    assert kinds(events) == ["run.created", "run.paused"]
    assert events[1].data["data"] == {"reason": "pause requested", "by": "alice", "from": "queued"}

    # Resumed, the second still waits its turn behind the (paused) first.
    assert (await control(env, second["runId"], "resume", env.alice)).status_code == 200
    assert (await control(env, first["runId"], "resume", env.alice)).status_code == 200
    (approval,) = (
        await env.client.get(f"/api/runs/{first['runId']}/approvals", headers=env.alice)
    ).json()["approvals"]
    decided = await env.client.post(
        f"/api/approvals/{approval['approvalId']}",
        json={"decision": "reject", "reason": "not today"},
        headers=env.rita,
    )
    assert decided.status_code == 200, decided.text
    await finished(env, first, env.alice)
    await finished(env, second, env.alice)


async def test_only_the_owner_or_a_tenant_admin_may_pause_or_resume(env: Env) -> None:
    run = await start(env, "rocket")
    run_id = run["runId"]
    await wait_for_status(env.client, run_id, "waiting_user", headers=env.alice)

    refused = await control(env, run_id, "pause", env.bob)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    assert "owner or a tenant admin" in refused.json()["error"]["message"]
    assert (await control(env, run_id, "pause", env.greg)).status_code == 404

    not_paused = await control(env, run_id, "resume", env.alice)
    assert not_paused.status_code == 409
    assert not_paused.json()["error"]["code"] == "not_paused"
    assert "waiting_user, not paused" in not_paused.json()["error"]["message"]

    assert (await control(env, run_id, "pause", env.boss)).status_code == 202
    again = await control(env, run_id, "pause", env.alice)  # pausing twice changes nothing
    assert again.status_code == 202 and again.json()["status"] == "paused"
    assert (await control(env, run_id, "resume", env.bob)).status_code == 403

    cancelled = await env.client.post(f"/api/runs/{run_id}/cancel", headers=env.alice)
    assert cancelled.json()["status"] == "cancelled"
    for action in ("pause", "resume"):
        finished_run = await control(env, run_id, action, env.alice)
        assert finished_run.status_code == 409
        assert finished_run.json()["error"]["code"] == "run_finished"
    (approval,) = (await env.client.get(f"/api/runs/{run_id}/approvals", headers=env.alice)).json()[
        "approvals"
    ]
    assert approval["status"] == "cancelled"


async def test_a_paused_run_does_not_count_toward_the_run_limit(env: Env) -> None:
    first = await start(env, "rocket", who=env.ivan)
    await wait_for_status(env.client, first["runId"], "waiting_user", headers=env.ivan)
    over = await post(env, "quick", who=env.ivan)
    assert over.status_code == 429, over.text  # the limit is one run in progress

    assert (await control(env, first["runId"], "pause", env.ivan)).status_code == 202
    second = await post(env, "quick", who=env.ivan)
    assert second.status_code == 202, second.text
    await finished(env, second.json(), env.ivan)


async def test_time_spent_paused_does_not_count_toward_the_deadline(env: Env, pool: Pool) -> None:
    run = await start(env, "count", options={"timeoutSeconds": 8})
    run_id = run["runId"]
    await snapshot_when(env, run_id, lambda s: s["items"] and s["items"][0]["text"])
    assert (await control(env, run_id, "pause", env.alice)).status_code == 202
    await wait_for_status(env.client, run_id, "paused", headers=env.alice)

    async def deadline() -> Any:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT deadline_at, deadline_at < now() AS passed FROM runs WHERE id = %s",
                (run_id,),
            )
            return await cur.fetchone()

    before = await deadline()
    async with asyncio.timeout(30):  # wait, paused, until the original deadline has passed
        while True:
            if (await deadline())["passed"]:
                break
            await asyncio.sleep(0.2)

    assert (await control(env, run_id, "resume", env.alice)).status_code == 200
    after = await deadline()
    assert after["deadline_at"] > before["deadline_at"] and not after["passed"]
    events = await finished(env, run, env.alice)
    assert "run.failed" not in kinds(events)


async def test_the_cli_pauses_and_resumes_a_run(
    env: Env, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    run = await start(env, "rocket")
    run_id = run["runId"]
    await wait_for_status(env.client, run_id, "waiting_user", headers=env.alice)
    cli = ClientConfig(
        url=str(env.client.base_url),
        api_key=env.alice["Authorization"].removeprefix("Bearer "),
    )
    capsys.readouterr()
    assert await cmd_runs(cli, build_parser().parse_args(["runs", "pause", run_id])) == 0
    assert f"agentrt runs resume {run_id}" in capsys.readouterr().out
    assert await cmd_runs(cli, build_parser().parse_args(["runs", "resume", run_id])) == 0
    assert "resumed: waiting_user" in capsys.readouterr().out
    with pytest.raises(ClientError, match=r"409: .* not paused"):
        await cmd_runs(cli, build_parser().parse_args(["runs", "resume", run_id]))
    await env.client.post(f"/api/runs/{run_id}/cancel", headers=env.alice)
