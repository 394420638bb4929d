"""A user message becomes a run that streams its events over real HTTP and SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, rebuild_output, serve

SCRIPTS = {
    "calc": [
        ScriptedTurn(
            text="Let me compute that.",
            tool_calls=[ScriptedToolCall(name="calculator", args={"expression": "6*7"})],
        ),
        ScriptedTurn(text="The answer is 42, as the calculator says."),
    ],
    "slow": [ScriptedTurn(text="word " * 60, chunk_chars=5, delay_s=0.02)],
    "loop": [
        ScriptedTurn(tool_calls=[ScriptedToolCall(name="current_time", args={})]),
    ]
    * 50,
}


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    app = create_app(settings, models=ModelRegistry(settings, SCRIPTS))
    async with serve(app) as url:
        yield url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as c:
        yield c


async def start_run(client: httpx.AsyncClient, content: str, **body: Any) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()
    response = await client.post(
        f"/api/conversations/{conv['conversationId']}/messages", json={"content": content, **body}
    )
    assert response.status_code == 202, response.text
    return dict(response.json())


async def test_message_becomes_run_with_tool_call_and_streamed_answer(
    client: httpx.AsyncClient,
) -> None:
    accepted = await start_run(client, "what is 6*7?", model="scripted:calc")
    assert accepted["status"] == "queued"
    assert accepted["streamUrl"] == f"/api/runs/{accepted['runId']}/events"

    events = await read_sse(client, accepted["streamUrl"])

    types = [e.event for e in events]
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert types[0] == "run.created" and types[1] == "run.started"
    assert types[-1] == "run.completed"
    assert types.index("tool.started") < types.index("tool.completed")
    tool = next(e for e in events if e.event == "tool.completed").data["data"]
    assert tool["name"] == "calculator" and tool["output"] == "42"
    text = rebuild_output(events)
    assert text == "Let me compute that.\n\nThe answer is 42, as the calculator says."

    snapshot = (await client.get(accepted["snapshotUrl"])).json()
    assert snapshot["status"] == "completed"
    assert snapshot["output"] == text
    assert snapshot["lastEventId"] == events[-1].id
    assert [t["status"] for t in snapshot["toolCalls"]] == ["completed"]

    run = (await client.get(f"/api/runs/{accepted['runId']}")).json()
    messages = (await client.get(f"/api/conversations/{run['conversationId']}/messages")).json()
    assert [m["role"] for m in messages["messages"]] == ["user", "assistant"]
    assert messages["messages"][1]["content"] == text
    assert messages["messages"][1]["messageId"] == run["outputMessageId"]
    assert run["status"] == "completed" and run["finishedAt"] is not None


async def test_demo_model_calls_tools_without_any_api_key(client: httpx.AsyncClient) -> None:
    accepted = await start_run(client, "what time is it, and what is 12*(3+4)?")
    events = await read_sse(client, accepted["streamUrl"])
    names = sorted(e.data["data"]["name"] for e in events if e.event == "tool.completed")
    assert names == ["calculator", "current_time"]
    assert "12*(3+4) = 84." in rebuild_output(events)
    assert events[-1].event == "run.completed"


async def test_step_limit_fails_the_run_with_a_clear_reason(client: httpx.AsyncClient) -> None:
    accepted = await start_run(client, "loop", model="scripted:loop", options={"maxSteps": 3})
    events = await read_sse(client, accepted["streamUrl"])
    assert events[-1].event == "run.failed"
    assert events[-1].data["data"]["errorType"] == "step_limit"
    run = (await client.get(f"/api/runs/{accepted['runId']}")).json()
    assert run["status"] == "failed"
    assert run["error"]["type"] == "step_limit"
    assert "limit is 3" in run["error"]["message"]


async def test_each_steps_task_writes_commit_with_the_checkpoint_that_ends_the_step(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    accepted = await start_run(client, "what is 6*7?", model="scripted:calc")
    events = await read_sse(client, accepted["streamUrl"])
    assert events[-1].event == "run.completed"
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT w.task_id, w.channel, w.xmin::text = c.xmin::text AS together"
            " FROM checkpoint_writes w JOIN checkpoints c ON c.thread_id = w.thread_id"
            " AND c.checkpoint_ns = w.checkpoint_ns AND c.parent_checkpoint_id = w.checkpoint_id"
            " WHERE w.thread_id = %s",
            (accepted["conversationId"],),
        )
        writes = await cur.fetchall()
    # The node of each step wrote (the tool's answer among them), and every write went in
    # the transaction of the checkpoint that followed it, not in one of its own.
    assert {w["channel"] for w in writes} >= {"messages"}
    assert len(writes) >= 5
    assert [w for w in writes if not w["together"]] == []
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT c.metadata->>'source' AS source, c.xmin::text = n.xmin::text AS together"
            " FROM checkpoints c JOIN checkpoints n ON n.thread_id = c.thread_id"
            " AND n.checkpoint_ns = c.checkpoint_ns AND n.parent_checkpoint_id = c.checkpoint_id"
            " WHERE c.thread_id = %s AND c.metadata->>'source' = 'input'",
            (accepted["conversationId"],),
        )
        inputs = await cur.fetchall()
    # The input checkpoint went in the transaction of the first step's checkpoint.
    assert inputs == [{"source": "input", "together": True}]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT xmin::text FROM checkpoints WHERE thread_id = %s"
            "        AND checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1) AS last,"
            " (SELECT xmin::text FROM run_events WHERE run_id = %s"
            "        AND type = 'run.completed') AS ended",
            (accepted["conversationId"], accepted["runId"]),
        )
        row = await cur.fetchone()
    # The graph's last checkpoint went in the transaction that recorded the run's end.
    assert row is not None and row["last"] == row["ended"]


async def test_a_tools_start_and_end_ride_the_write_that_follows_the_tools(
    settings: Settings, pool: Pool
) -> None:
    # A linger no tool here outlasts, however loaded the machine: the calculator's start waits
    # for its end, and both for the next write of the run after the tools' step: a checkpoint,
    # or the answer's first events (the tools' checkpoint may wait for the next one's).
    lingering = settings.model_copy(update={"event_linger_s": 30.0})
    app = create_app(lingering, models=ModelRegistry(lingering, SCRIPTS))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        accepted = await start_run(client, "what is 6*7?", model="scripted:calc")
        events = await read_sse(client, accepted["streamUrl"])
    kinds = [e.event for e in events]
    assert kinds.index("tool.started") < kinds.index("tool.completed")
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT e.type, e.xmin::text AS tx, EXISTS (SELECT 1 FROM checkpoints c"
            " WHERE c.thread_id = %s AND c.xmin::text = e.xmin::text) OR EXISTS (SELECT 1"
            " FROM run_events o WHERE o.run_id = e.run_id AND o.xmin::text = e.xmin::text"
            " AND o.type NOT LIKE 'tool.%%') AS carried"
            " FROM run_events e WHERE e.run_id = %s AND e.type LIKE 'tool.%%'",
            (accepted["conversationId"], accepted["runId"]),
        )
        rows = {r["type"]: r for r in await cur.fetchall()}
    # Both rode another write's transaction, in no transaction of their own.
    assert rows["tool.started"]["tx"] == rows["tool.completed"]["tx"]
    assert rows["tool.started"]["carried"]


async def test_the_first_context_and_tools_steps_checkpoints_ride_later_writes(
    settings: Settings, pool: Pool
) -> None:
    # A hold and a linger no step here outlasts, however loaded the machine.
    holding = settings.model_copy(update={"checkpoint_hold_s": 30.0, "event_linger_s": 30.0})
    app = create_app(holding, models=ModelRegistry(holding, SCRIPTS))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        accepted = await start_run(client, "what is 6*7?", model="scripted:calc")
        events = await read_sse(client, accepted["streamUrl"])
    assert events[-1].event == "run.completed"
    run_id, thread = accepted["runId"], accepted["conversationId"]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (metadata->>'step')::int AS step, (SELECT count(*) FROM checkpoints o"
            " WHERE o.thread_id = c.thread_id AND o.xmin::text = c.xmin::text) AS together"
            " FROM checkpoints c WHERE thread_id = %s AND checkpoint_ns = ''"
            " ORDER BY checkpoint_id",
            (thread,),
        )
        checkpoints = {r["step"]: r["together"] for r in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT count(DISTINCT tx) AS n FROM (SELECT xmin::text AS tx FROM checkpoints"
            " WHERE thread_id = %s UNION ALL SELECT xmin::text FROM run_events"
            " WHERE run_id = %s) t",
            (thread, run_id),
        )
        transactions = await cur.fetchone()
        cur = await conn.execute(
            "SELECT (SELECT xmin::text::bigint FROM checkpoints WHERE thread_id = %s"
            "        AND checkpoint_ns = '' AND metadata->>'step' = '2') AS turn,"
            " (SELECT xmin::text::bigint FROM tool_ledger WHERE run_id = %s) AS tool",
            (thread, run_id),
        )
        order = await cur.fetchone()
    # The input (step -1), then after __start__ (0), build_context (1), call_model (2),
    # dispatch_tools (3), build_context (4), call_model (5). The steps a later attempt runs
    # again at no cost (0, 1, 3, 4) were stored with other checkpoints, in the transactions of
    # the writes after them (an event append, the next checkpoint, the run's end), none in a
    # transaction of its own.
    assert sorted(checkpoints) == [-1, 0, 1, 2, 3, 4, 5]
    assert [step for step in (0, 1, 3, 4) if checkpoints[step] < 2] == []
    # All the run's checkpoints and events took six transactions: its creation, its claim, the
    # first answer's events, the model's turn, the second answer's events, its end.
    assert transactions is not None and transactions["n"] <= 6
    # The model's turn was stored before its tool was claimed: no tool runs on a turn that a
    # crash could make the model take again.
    assert order is not None and order["turn"] < order["tool"]
