"""Subagents in one process: delegation, results, refusals, schemas, cancel and retry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app, default_tools
from server.client.tree import load_tree, render_run_tree
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve, wait_for_status
from tools.spec import agent_tool

pytestmark = pytest.mark.timeout(240)
SLOW_S = 120

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}


def delegate(call_id: str, **args: Any) -> ScriptedToolCall:
    return ScriptedToolCall(id=call_id, name="delegate", args=args)


SCRIPTS = {
    "boss": [
        ScriptedTurn(
            text="Splitting the work.",
            tool_calls=[
                delegate("d1", task="Find the population of Paris.", agent="researcher"),
                delegate(
                    "d2",
                    task="Give Lyon's population as JSON.",
                    agent="writer",
                    output_schema=SCHEMA,
                ),
            ],
        ),
        ScriptedTurn(text="Both subagents answered."),
    ],
    "research": [ScriptedTurn(text="Paris has 2102650 inhabitants.")],
    "write": [ScriptedTurn(text='```json\n{"city": "Lyon", "population": 522250}\n```')],
    "refused": [
        ScriptedTurn(
            tool_calls=[
                delegate("r1", task="x", agent="nobody"),
                delegate("r2", task="y", tools=["fetch_url"]),
            ]
        ),
        ScriptedTurn(text="Refused twice."),
    ],
    "strict": [
        ScriptedTurn(tool_calls=[delegate("s1", task="t", agent="broken", on_failure="fail")]),
        ScriptedTurn(text="never"),
    ],
    "broken": [ScriptedTurn(error="provider exploded")],
    "waiter": [
        ScriptedTurn(tool_calls=[delegate("w1", task="wait", agent="sleeper")]),
        ScriptedTurn(text="The sleeper answered."),
    ],
    "sleepy": [ScriptedTurn(tool_calls=[ScriptedToolCall(id="n1", name="nap", args={})])],
}
PROFILES = [
    {"name": "boss", "model": "scripted:boss", "tools": ["delegate", "current_time"]},
    {"name": "researcher", "model": "scripted:research", "tools": ["current_time"]},
    {"name": "writer", "model": "scripted:write"},
    {"name": "refuser", "model": "scripted:refused", "tools": ["delegate", "current_time"]},
    {"name": "stickler", "model": "scripted:strict", "tools": ["delegate"]},
    {"name": "broken", "model": "scripted:broken"},
    {"name": "waiter", "model": "scripted:waiter", "tools": ["delegate"]},
    {"name": "sleeper", "model": "scripted:sleepy", "tools": ["nap"]},
]


@agent_tool
async def nap() -> str:
    """Rest for a minute."""
    await asyncio.sleep(60)
    return "rested"


@pytest.fixture(scope="module")
async def client(settings: Settings, pool: Pool) -> AsyncIterator[httpx.AsyncClient]:
    custom = settings.model_copy(update={"worker_concurrency": 8, "worker_poll_seconds": 0.3})
    tools = [*default_tools(custom), nap]
    app = create_app(custom, models=ModelRegistry(custom, SCRIPTS), tools=tools)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        for profile in PROFILES:
            created = await c.post("/api/agents", json=profile)
            assert created.status_code == 201, created.text
        yield c


async def start(client: httpx.AsyncClient, agent: str) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "agent": agent}
    )
    assert response.status_code == 202, response.text
    return dict(response.json())


async def wait_children(client: httpx.AsyncClient, run_id: str, count: int) -> list[Any]:
    async with asyncio.timeout(SLOW_S):
        while True:
            children = (await client.get(f"/api/runs/{run_id}/children")).json()["children"]
            if len(children) >= count:
                return list(children)
            await asyncio.sleep(0.05)


async def test_a_parent_delegates_to_two_children_and_resumes_with_both_results(
    client: httpx.AsyncClient,
) -> None:
    run = await start(client, "boss")
    done = await wait_for_status(client, run["runId"], "completed", limit_s=SLOW_S)
    events = await read_sse(client, run["streamUrl"])
    kinds = [e.event for e in events]
    started = [e.data["data"] for e in events if e.event == "subagent.started"]
    ended = [e.data["data"] for e in events if e.event == "subagent.completed"]
    assert [s["toolCallId"] for s in started] == ["d1", "d2"]
    assert {e["toolCallId"]: e["status"] for e in ended} == {"d1": "completed", "d2": "completed"}
    assert kinds.index("subagent.completed") > kinds.index("subagent.started")
    # The children's answers came back as the delegate calls' tool results.
    results = {
        e.data["data"]["toolCallId"]: e.data["data"] for e in events if e.event == "tool.completed"
    }
    assert "2102650" in results["d1"]["output"]
    assert results["d2"]["output"] == '{"city": "Lyon", "population": 522250}'
    assert done["outputMessageId"] is not None

    children = await wait_children(client, run["runId"], 2)
    assert [c["toolCallId"] for c in children] == ["d1", "d2"]
    assert {c["agent"]["name"] for c in children} == {"researcher", "writer"}
    assert all(c["status"] == "completed" and c["depth"] == 1 for c in children)
    child = (await client.get(f"/api/runs/{children[0]['runId']}")).json()
    assert child["parentRunId"] == run["runId"] and child["depth"] == 1
    # Each child has its own full log and stream.
    child_events = await read_sse(client, f"/api/runs/{children[0]['runId']}/events")
    assert child_events[0].event == "run.created" and child_events[-1].event == "run.completed"

    snap = (await client.get(f"/api/runs/{run['runId']}/snapshot")).json()
    assert [(c["toolCallId"], c["status"]) for c in snap["children"]] == [
        ("d1", "completed"),
        ("d2", "completed"),
    ]

    # The trace shows each child's run as a subtree of the parent's root span.
    trace = (await client.get(f"/api/runs/{run['runId']}/trace")).json()
    subtrees = [s for s in trace["root"]["children"] if s["name"].startswith("subagent ")]
    assert sorted(s["attributes"]["agentrt.run_id"] for s in subtrees) == sorted(
        c["runId"] for c in children
    )
    assert all(s["children"] for s in subtrees)  # the child's own spans below it

    # `agentrt runs show` draws the tree.
    tree = render_run_tree(
        await load_tree(client, (await client.get(f"/api/runs/{run['runId']}")).json())
    )
    lines = tree.splitlines()
    assert lines[0].startswith(run["runId"]) and len(lines) == 3
    assert lines[1].startswith("├─ [d1]") and "researcher@1" in lines[1]
    assert lines[2].startswith("└─ [d2]") and "writer@1" in lines[2]


async def test_usage_of_a_parent_rolls_up_its_children_exactly(client: httpx.AsyncClient) -> None:
    run = await start(client, "boss")
    await wait_for_status(client, run["runId"], "completed", limit_s=SLOW_S)
    children = await wait_children(client, run["runId"], 2)
    usage = (await client.get(f"/api/runs/{run['runId']}/usage")).json()
    own = usage["totals"]
    kids = [(await client.get(f"/api/runs/{c['runId']}/usage")).json()["totals"] for c in children]
    total = usage["withDescendants"]
    assert total["runs"] == 3
    for key in ("inputTokens", "outputTokens", "totalTokens", "modelCalls"):
        assert total[key] == own[key] + sum(k[key] for k in kids), key
    assert Decimal(total["knownCost"]) == Decimal(own["knownCost"]) + sum(
        Decimal(k["knownCost"]) for k in kids
    )
    assert own["modelCalls"] == 2 and all(k["modelCalls"] == 1 for k in kids)


async def test_refused_delegations_come_back_as_tool_errors_without_a_child(
    client: httpx.AsyncClient,
) -> None:
    run = await start(client, "refuser")
    await wait_for_status(client, run["runId"], "completed", limit_s=SLOW_S)
    events = await read_sse(client, run["streamUrl"])
    failed = {
        e.data["data"]["toolCallId"]: e.data["data"]["error"]
        for e in events
        if e.event == "tool.failed"
    }
    assert "'nobody' does not exist" in failed["r1"]
    assert "not yours: ['fetch_url']" in failed["r2"]
    assert (await client.get(f"/api/runs/{run['runId']}/children")).json()["children"] == []


async def test_a_failed_child_fails_the_parent_when_the_delegation_says_so(
    client: httpx.AsyncClient,
) -> None:
    run = await start(client, "stickler")
    failed = await wait_for_status(client, run["runId"], "failed", limit_s=SLOW_S)
    assert failed["error"]["type"] == "SubagentFailedError"
    assert "failed" in failed["error"]["message"]


async def test_a_waiting_parent_holds_no_worker_and_cancelling_it_cancels_its_child(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    run = await start(client, "waiter")
    (child,) = await wait_children(client, run["runId"], 1)
    parent = await wait_for_status(client, run["runId"], "waiting_tool", limit_s=SLOW_S)
    assert parent["leaseOwner"] is None
    await wait_for_status(client, child["runId"], "waiting_tool", limit_s=SLOW_S)

    cancelled = await client.post(f"/api/runs/{run['runId']}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["cancelled"] is True
    await wait_for_status(client, child["runId"], "cancelled", limit_s=10)


async def test_retry_refuses_a_run_that_is_not_a_subagent(client: httpx.AsyncClient) -> None:
    run = await start(client, "boss")
    await wait_for_status(client, run["runId"], "completed", limit_s=SLOW_S)
    answer = await client.post(f"/api/runs/{run['runId']}/retry")
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "not_retryable"
    assert "only a subagent's run" in answer.json()["error"]["message"]
