"""Subagents on real worker processes: kill -9 mid-child, cancel of a parent, retry of a child.

The API runs in the test process (no workers); parents and children execute in `agentrt
worker` processes, one run at a time each, so two children run on two processes.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.settings import Settings
from tests.support.live import SseEvent, api_client, read_sse, rebuild_output, wait_for_status
from tests.support.processes import worker_env, workers, write_scripts

pytestmark = pytest.mark.timeout(420)
SLOW_S = 180

TEXT_A = "alpha " * 60
TEXT_B = "bravo " * 60
WORKER_SETTINGS = {
    "lease_seconds": 2.0,
    "worker_poll_seconds": 0.5,
    "worker_concurrency": 1,
    "tool_modules": ["tests.support.subagent_tools:wait_for_file"],
}


def delegate(call_id: str, agent: str, task: str = "do it") -> ScriptedToolCall:
    return ScriptedToolCall(id=call_id, name="delegate", args={"task": task, "agent": agent})


def waiting(path: Path, text: str) -> list[ScriptedTurn]:
    call = ScriptedToolCall(id="w", name="wait_for_file", args={"path": str(path)})
    return [ScriptedTurn(tool_calls=[call]), ScriptedTurn(text=text)]


def scripts(folder: Path) -> dict[str, list[ScriptedTurn]]:
    return {
        "boss": [
            ScriptedTurn(
                text="Delegating.", tool_calls=[delegate("a", "alpha"), delegate("b", "bravo")]
            ),
            ScriptedTurn(text="Both answered."),
        ],
        "alpha": [ScriptedTurn(text=TEXT_A, chunk_chars=6, delay_s=0.05)],
        "bravo": [ScriptedTurn(text=TEXT_B, chunk_chars=6, delay_s=0.05)],
        "pair": [
            ScriptedTurn(tool_calls=[delegate("p", "patient"), delegate("q", "quiet")]),
            ScriptedTurn(text="Pair done."),
        ],
        "patient": waiting(folder / "go", "patient done"),
        "quiet": waiting(folder / "go", "quiet done"),
        "hold": [
            ScriptedTurn(tool_calls=[delegate("h1", "holder1"), delegate("h2", "holder2")]),
            ScriptedTurn(text="never"),
        ],
        "holder1": waiting(folder / "never", "x"),
        "holder2": waiting(folder / "never", "y"),
    }


PROFILES = {
    "boss": ["delegate"],
    "alpha": None,
    "bravo": None,
    "pair": ["delegate"],
    "patient": ["wait_for_file"],
    "quiet": ["wait_for_file"],
    "hold": ["delegate"],
    "holder1": ["wait_for_file"],
    "holder2": ["wait_for_file"],
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("subagents")


@pytest.fixture(scope="module")
def scripts_file(folder: Path) -> Path:
    return write_scripts(folder / "scripts.json", scripts(folder))


@pytest.fixture(scope="module")
def env(database_url: str, scripts_file: Path) -> dict[str, str]:
    return worker_env(database_url, scripted_models_file=str(scripts_file), **WORKER_SETTINGS)


@pytest.fixture(scope="module")
async def client(settings: Settings, scripts_file: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings, scripted_models_file=scripts_file, **WORKER_SETTINGS) as c:
        for name, tools in PROFILES.items():
            body: dict[str, Any] = {"name": name, "model": f"scripted:{name}"}
            if tools is not None:
                body["tools"] = tools
            created = await c.post("/api/agents", json=body)
            assert created.status_code == 201, created.text
        yield c


async def start(client: httpx.AsyncClient, agent: str) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "agent": agent}
    )
    assert response.status_code == 202, response.text
    return dict(response.json())


async def children_of(client: httpx.AsyncClient, run_id: str, count: int) -> list[Any]:
    async with asyncio.timeout(SLOW_S):
        while True:
            found = (await client.get(f"/api/runs/{run_id}/children")).json()["children"]
            if len(found) >= count:
                return list(found)
            await asyncio.sleep(0.05)


async def until(client: httpx.AsyncClient, run_id: str, predicate: Any) -> dict[str, Any]:
    async with asyncio.timeout(SLOW_S):
        while True:
            run = (await client.get(f"/api/runs/{run_id}")).json()
            snap = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
            if predicate(run, snap):
                return dict(run)
            await asyncio.sleep(0.05)


def payloads(events: list[SseEvent], kind: str) -> list[dict[str, Any]]:
    return [e.data["data"] for e in events if e.event == kind]


def stamp(events: list[SseEvent], kind: str) -> datetime:
    (found,) = [e.data["ts"] for e in events if e.event == kind]
    return datetime.fromisoformat(found.replace("Z", "+00:00"))


async def test_a_child_whose_worker_is_killed_completes_once_and_the_parent_gets_both(
    client: httpx.AsyncClient, env: dict[str, str]
) -> None:
    async with workers(env, count=2) as procs:
        run = await start(client, "boss")
        kids = await children_of(client, run["runId"], 2)
        by_agent = {k["agent"]["name"]: k["runId"] for k in kids}
        # Both children stream at once, on the two processes.
        streaming = await until(
            client,
            by_agent["alpha"],
            lambda r, s: r["leaseOwner"] and len(s["output"]) > 30,
        )
        await until(client, by_agent["bravo"], lambda r, s: len(s["output"]) > 30)
        (victim,) = [p for p in procs if str(p.proc.pid) in streaming["leaseOwner"].split(":")]
        victim.signal(signal.SIGKILL)
        await victim.wait()
        async with workers(env, count=1):
            done = await wait_for_status(client, run["runId"], "completed", limit_s=SLOW_S)

    assert done["outputMessageId"]
    assert len((await client.get(f"/api/runs/{run['runId']}/children")).json()["children"]) == 2
    events = await read_sse(client, run["streamUrl"])
    fresh = [s for s in payloads(events, "subagent.started") if not s.get("replayed")]
    assert sorted(s["toolCallId"] for s in fresh) == ["a", "b"]
    reported = payloads(events, "subagent.completed")
    assert sorted((c["toolCallId"], c["status"]) for c in reported) == [
        ("a", "completed"),
        ("b", "completed"),
    ]
    results = {r["toolCallId"]: r["output"] for r in payloads(events, "tool.completed")}
    assert results == {"a": TEXT_A, "b": TEXT_B}

    alpha = await read_sse(client, f"/api/runs/{by_agent['alpha']}/events")
    assert [e.event for e in alpha].count("run.requeued") == 1
    assert [e.event for e in alpha if e.event.startswith("run.")][-1] == "run.completed"
    assert [e.event for e in alpha].count("run.completed") == 1
    assert rebuild_output(alpha) == TEXT_A
    child = (await client.get(f"/api/runs/{by_agent['alpha']}")).json()
    assert child["attempt"] == 2 and child["recoveries"] == 1


async def test_cancelling_a_parent_cancels_its_running_children_within_a_second(
    client: httpx.AsyncClient, env: dict[str, str]
) -> None:
    async with workers(env, count=2):
        run = await start(client, "hold")
        kids = await children_of(client, run["runId"], 2)
        for kid in kids:
            # Running on a worker: waiting on their tool, the lease held.
            await until(
                client, kid["runId"], lambda r, s: r["status"] == "waiting_tool" and r["leaseOwner"]
            )
        answer = await client.post(f"/api/runs/{run['runId']}/cancel")
        assert answer.status_code == 202 and answer.json()["cancelled"] is True
        for kid in kids:
            await wait_for_status(client, kid["runId"], "cancelled", limit_s=SLOW_S)

    parent = await read_sse(client, run["streamUrl"])
    cancelled_at = stamp(parent, "run.cancelled")
    for kid in kids:
        events = await read_sse(client, f"/api/runs/{kid['runId']}/events")
        lag = (stamp(events, "run.cancelled") - cancelled_at).total_seconds()
        assert lag < 1.0, f"child {kid['runId']} was cancelled {lag:.2f}s after its parent"


async def test_a_child_retried_on_its_own_feeds_the_parent_its_new_result(
    client: httpx.AsyncClient, env: dict[str, str], folder: Path
) -> None:
    async with workers(env, count=2):
        run = await start(client, "pair")
        kids = await children_of(client, run["runId"], 2)
        by_agent = {k["agent"]["name"]: k["runId"] for k in kids}
        first = by_agent["patient"]
        await until(client, first, lambda r, s: r["status"] == "waiting_tool")
        assert (await client.post(f"/api/runs/{first}/retry")).status_code == 409  # running

        # Cancelled on its own: the parent is told, and still waits for its other child.
        assert (await client.post(f"/api/runs/{first}/cancel")).status_code == 202
        await wait_for_status(client, first, "cancelled", limit_s=SLOW_S)
        await until(
            client,
            run["runId"],
            lambda r, s: any(
                c["toolCallId"] == "p" and c["status"] == "cancelled" for c in s["children"]
            ),
        )
        retried = await client.post(f"/api/runs/{first}/retry")
        assert retried.status_code == 202, retried.text
        second = retried.json()
        assert second["parentRunId"] == run["runId"] and second["runId"] != first
        assert (await client.post(f"/api/runs/{first}/retry")).json()["error"]["code"] == (
            "not_retryable"
        )

        (folder / "go").write_text("go")
        await wait_for_status(client, run["runId"], "completed", limit_s=SLOW_S)

    events = await read_sse(client, run["streamUrl"])
    results = {r["toolCallId"]: r["output"] for r in payloads(events, "tool.completed")}
    assert results == {"p": "patient done", "q": "quiet done"}
    children = (await client.get(f"/api/runs/{run['runId']}/children")).json()["children"]
    assert [
        (c["runId"], c["status"], c["current"]) for c in children if c["toolCallId"] == "p"
    ] == [
        (first, "cancelled", False),
        (second["runId"], "completed", True),
    ]

    # Usage rolls up exactly: the parent's own figures plus all three children's.
    usage = (await client.get(f"/api/runs/{run['runId']}/usage")).json()
    kids_usage = [
        (await client.get(f"/api/runs/{c['runId']}/usage")).json()["totals"] for c in children
    ]
    total, own = usage["withDescendants"], usage["totals"]
    assert total["runs"] == 4
    for key in ("inputTokens", "outputTokens", "totalTokens", "modelCalls", "toolCalls"):
        assert total[key] == own[key] + sum(k.get(key, 0) for k in kids_usage), key
    assert Decimal(total["knownCost"]) == Decimal(own["knownCost"]) + sum(
        Decimal(k.get("knownCost") or 0) for k in kids_usage
    )
