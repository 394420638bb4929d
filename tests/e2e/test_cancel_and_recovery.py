"""Cancel in each state, and a run that survives its server being stopped mid-answer."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, rebuild_output, serve, wait_for_status

SCRIPTS = {
    "slow": [
        ScriptedTurn(
            text="First I check the time.",
            chunk_chars=4,
            tool_calls=[ScriptedToolCall(name="current_time", args={})],
        ),
        ScriptedTurn(text="tick " * 200, chunk_chars=5, delay_s=0.02),
    ],
}


@pytest.fixture(scope="module")
def quick(settings: Settings) -> Settings:
    return settings.model_copy(update={"lease_seconds": 1.0, "worker_poll_seconds": 0.5})


def app_for(settings: Settings, **overrides: Any) -> Any:
    s = settings.model_copy(update=overrides)
    return create_app(s, models=ModelRegistry(s, SCRIPTS))


async def post_run(client: httpx.AsyncClient) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": "scripted:slow"}
    )
    assert response.status_code == 202
    return dict(response.json())


async def wait_for_text(client: httpx.AsyncClient, run_id: str, item: int) -> dict[str, Any]:
    async with asyncio.timeout(20):
        while True:
            snap = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
            if len(snap["items"]) > item and snap["items"][item]["text"]:
                return dict(snap)
            await asyncio.sleep(0.01)


async def test_cancel_of_a_queued_run_takes_effect_at_once(quick: Settings) -> None:
    async with (
        serve(app_for(quick, run_workers=False)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        run = await post_run(client)
        response = await client.post(f"/api/runs/{run['runId']}/cancel")
        assert response.status_code == 202
        assert response.json()["status"] == "cancelled"
        events = await read_sse(client, run["streamUrl"])
        assert [e.event for e in events] == ["run.created", "run.cancelled"]


async def test_a_cancel_that_comes_before_the_runs_task_first_steps_still_ends_the_run(
    quick: Settings,
) -> None:
    app = app_for(quick, worker_concurrency=0)  # its worker claims nothing: the test does
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
        run = await post_run(client)
        worker = app.state.worker
        assert await worker.claim_one()
        worker.cancel_run(run["runId"])  # the run's task has not taken a step yet
        record = await wait_for_status(client, run["runId"], "cancelled", limit_s=60)
        assert record["leaseOwner"] is None
        events = await read_sse(client, run["streamUrl"])
        assert [e.event for e in events] == ["run.created", "run.started", "run.cancelled"]
        async with asyncio.timeout(60):
            while run["runId"] in worker.active_runs:  # noqa: ASYNC110 (in-memory slots)
                await asyncio.sleep(0.05)


async def test_cancel_stops_a_streaming_run_with_one_terminal_event(quick: Settings) -> None:
    async with serve(app_for(quick)) as url, httpx.AsyncClient(base_url=url) as client:
        run = await post_run(client)
        await wait_for_text(client, run["runId"], 1)
        response = await client.post(f"/api/runs/{run['runId']}/cancel")
        assert response.status_code == 202
        async with asyncio.timeout(5):
            events = await read_sse(client, run["streamUrl"])
        terminal = [
            e.event
            for e in events
            if e.event.startswith("run.")
            and e.event in ("run.completed", "run.failed", "run.cancelled")
        ]
        assert terminal == ["run.cancelled"]
        snap = (await client.get(f"/api/runs/{run['runId']}/snapshot")).json()
        assert snap["status"] == "cancelled"
        assert snap["items"][1]["status"] == "interrupted"
        assert (await client.post(f"/api/runs/{run['runId']}/cancel")).status_code == 409


async def test_run_resumes_after_its_server_stops_mid_answer(quick: Settings) -> None:
    # No drain grace: the first server hands the run back mid-answer.
    async with (
        serve(app_for(quick, drain_grace_s=0)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        run = await post_run(client)
        before = await wait_for_text(client, run["runId"], 1)
    # The first server is gone mid-answer; its lease expires and a new server takes over.
    assert before["status"] == "running"
    async with serve(app_for(quick)) as url, httpx.AsyncClient(base_url=url) as client:
        async with asyncio.timeout(30):
            events = await read_sse(client, run["streamUrl"])
        record = (await client.get(f"/api/runs/{run['runId']}")).json()
        snap = (await client.get(f"/api/runs/{run['runId']}/snapshot")).json()
        messages = (
            await client.get(f"/api/conversations/{record['conversationId']}/messages")
        ).json()["messages"]

    assert [e.id for e in events] == list(range(1, len(events) + 1))
    kinds = [e.event for e in events]
    assert kinds.count("run.started") == 2 and "run.requeued" in kinds
    assert events[-1].event == "run.completed" and record["attempt"] == 2
    superseded = [
        e
        for e in events
        if e.event == "message.item.completed" and e.data["data"]["status"] == "superseded"
    ]
    assert len(superseded) == 1
    expected = "First I check the time.\n\n" + "tick " * 200
    assert rebuild_output(events) == expected == snap["output"] == messages[-1]["content"]
    # The tool ran before the crash and its result was checkpointed: not run again.
    assert kinds.count("tool.started") == 1
