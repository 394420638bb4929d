"""When a run's tool calls reach the ledger: claimed first, or written with their outcome.

And what is stored of an output Postgres could not hold as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve
from tools.spec import ToolSpec, agent_tool

RUNNING = {"lookup": asyncio.Event(), "send": asyncio.Event()}
RELEASE = asyncio.Event()


@agent_tool
async def lookup() -> str:
    """Look something up (no side effect: safe to run twice)."""
    RUNNING["lookup"].set()
    await RELEASE.wait()
    return "found"


@agent_tool(idempotent=False)
async def send() -> str:
    """Send something (a side effect that must not happen twice)."""
    RUNNING["send"].set()
    await RELEASE.wait()
    return "sent"


@agent_tool
async def binary() -> str:
    """Read a file that holds a NUL character."""
    return "a\x00b"


@agent_tool
async def broken() -> str:
    """Fail with a message that holds a NUL character."""
    raise ValueError("bad byte \x00 here")


SCRIPTS = {
    "nul": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(id="c_nul", name="binary"),
                ScriptedToolCall(id="c_broken", name="broken"),
            ]
        ),
        ScriptedTurn(text="Read."),
    ],
    # A model's answer holding a NUL character (streamed in pieces of 4 characters).
    "nul_text": [ScriptedTurn(text="one\x00two \x00three", chunk_chars=4)],
    "both": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(id="c_lookup", name="lookup"),
                ScriptedToolCall(id="c_send", name="send"),
            ]
        ),
        ScriptedTurn(text="Done."),
    ],
}


def tools() -> list[ToolSpec]:
    return [lookup, send, binary, broken]


@pytest.fixture
async def base(settings: Settings) -> AsyncIterator[str]:
    application = create_app(settings, models=ModelRegistry(settings, SCRIPTS), tools=tools())
    async with serve(application) as url:
        yield url


async def _post(client: httpx.AsyncClient, script: str) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()
    response = await client.post(
        f"/api/conversations/{conv['conversationId']}/messages",
        json={"content": "go", "model": f"scripted:{script}"},
    )
    return dict(response.json())


async def _ledger(pool: Pool, run_id: str) -> dict[str, dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tool_call_id, status, attempts, output, xmin::text AS xid, started_at,"
            " finished_at FROM tool_ledger WHERE run_id = %s",
            (run_id,),
        )
        return {r["tool_call_id"]: r for r in await cur.fetchall()}


async def test_a_call_safe_to_rerun_is_written_with_its_outcome_event(
    base: str, pool: Pool
) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        run = await _post(client, "both")
        async with asyncio.timeout(30):
            for running in RUNNING.values():
                await running.wait()
        # Both are running: the call that must not run twice was claimed before it started;
        # the one that may run twice has no row yet.
        during = await _ledger(pool, run["runId"])
        assert {k: r["status"] for k, r in during.items()} == {"c_send": "started"}
        RELEASE.set()
        events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed"

    after = await _ledger(pool, run["runId"])
    assert {k: (r["status"], r["attempts"], r["output"]) for k, r in after.items()} == {
        "c_lookup": ("completed", 1, "found"),
        "c_send": ("completed", 1, "sent"),
    }
    lookup_row = after["c_lookup"]
    assert lookup_row["started_at"] <= lookup_row["finished_at"]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT data ->> 'toolCallId' AS call, xmin::text AS xid FROM run_events"
            " WHERE run_id = %s AND type = 'tool.completed'",
            (run["runId"],),
        )
        event_xid = {r["call"]: r["xid"] for r in await cur.fetchall()}
    # One transaction stored the lookup's outcome event and its ledger row.
    assert lookup_row["xid"] == event_xid["c_lookup"]
    assert after["c_send"]["xid"] != event_xid["c_send"]


async def test_an_output_with_a_nul_character_is_stored_with_its_event(
    base: str, pool: Pool
) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        run = await _post(client, "nul")
        events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed"
    rows = await _ledger(pool, run["runId"])
    # The NUL (which Postgres text and jsonb refuse) is stored as U+FFFD, in both places.
    assert (rows["c_nul"]["status"], rows["c_nul"]["output"]) == ("completed", "a\ufffdb")
    (done,) = [e for e in events if e.event == "tool.completed"]
    assert done.data["data"]["output"] == "a\ufffdb"
    (failed,) = [e for e in events if e.event == "tool.failed"]
    assert failed.data["data"]["error"] == "bad byte \ufffd here"
    assert rows["c_broken"]["status"] == "failed"


async def test_a_model_answer_with_a_nul_character_is_stored_and_streamed_alike(
    base: str,
) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        run = await _post(client, "nul_text")
        live = await read_sse(client, run["streamUrl"])
        replayed = await read_sse(client, f"/api/runs/{run['runId']}/events?after=0")
        snapshot = (await client.get(f"/api/runs/{run['runId']}/snapshot")).json()
        conv = run["conversationId"]
        history = (await client.get(f"/api/conversations/{conv}/messages")).json()
    assert live[-1].event == "run.completed", live[-1].data
    answer = "one\ufffdtwo \ufffdthree"
    deltas = "".join(e.data["data"]["delta"] for e in live if e.event == "message.item.delta")
    assert deltas == answer
    assert live[-1].data["data"]["output"] == answer
    # What a client reconnecting reads is what the live stream sent, event for event.
    assert [(e.id, e.event, e.data) for e in replayed] == [(e.id, e.event, e.data) for e in live]
    assert snapshot["items"][-1]["text"] == answer
    assert history["messages"][-1]["content"] == answer
