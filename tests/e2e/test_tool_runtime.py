"""Every tool call goes through the pipeline; refusals and failures reach the model, not the run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from langchain_core.messages import ToolMessage

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, rebuild_output, serve
from tools.builtin import calculator
from tools.config import ToolConfig
from tools.spec import ToolSpec, agent_tool, from_langchain


@agent_tool(timeout_s=0.3)
async def slow() -> str:
    """Take far too long."""
    await asyncio.sleep(30)
    return "late"


@agent_tool
async def boom() -> str:
    """Always fail."""
    raise RuntimeError("the widget exploded")


@agent_tool(permissions={"vault:read"})
async def secret() -> str:
    """Read a secret from the vault."""
    return "s3cr3t"


@agent_tool
async def forbidden_tool() -> str:
    """Something this tenant may not use."""
    return "should not run"


@agent_tool
async def big() -> str:
    """Return a huge result."""
    return "y" * 40_000


@agent_tool(redact=("user",))
async def login(user: str, password: str) -> str:
    """Log in to the legacy system.

    Args:
        user: The account.
        password: Its password.
    """
    return f"logged in as {user}"


def tools() -> list[ToolSpec]:
    return [from_langchain(calculator), slow, boom, secret, forbidden_tool, big, login]


CALLS = [
    ScriptedToolCall(id="c_unknown", name="nope"),
    ScriptedToolCall(id="c_schema", name="calculator", args={"expr": "1+1"}),
    ScriptedToolCall(id="c_forbidden", name="forbidden_tool"),
    ScriptedToolCall(id="c_permission", name="secret"),
    ScriptedToolCall(id="c_timeout", name="slow"),
    ScriptedToolCall(id="c_error", name="boom"),
    ScriptedToolCall(id="c_big", name="big"),
    ScriptedToolCall(id="c_login", name="login", args={"user": "bob", "password": "hunter2"}),
    ScriptedToolCall(id="c_ok", name="calculator", args={"expression": "6*7"}),
]
SCRIPTS = {"all": [ScriptedTurn(tool_calls=CALLS), ScriptedTurn(text="All done.")]}
EXPECTED_FAILURES = {
    "c_unknown": "unknown_tool",
    "c_schema": "invalid_arguments",
    "c_forbidden": "forbidden",
    "c_permission": "permission_denied",
    "c_timeout": "timeout",
    "c_error": "error",
}


@pytest.fixture(scope="module")
async def app(settings: Settings) -> AsyncIterator[tuple[FastAPI, str]]:
    config = ToolConfig.model_validate(
        {"default": {"deny": ["forbidden_tool"], "grants": {"*": []}}}
    )
    custom = settings.model_copy(update={"tool_config": config, "tool_max_output_chars": 1000})
    application = create_app(custom, models=ModelRegistry(custom, SCRIPTS), tools=tools())
    async with serve(application) as url:
        yield application, url


@pytest.fixture
async def client(app: tuple[FastAPI, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=app[1], timeout=30) as c:
        yield c


async def test_refusals_and_failures_become_tool_errors_and_the_run_continues(
    app: tuple[FastAPI, str], client: httpx.AsyncClient, pool: Pool
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()
    run = (
        await client.post(
            f"/api/conversations/{conv['conversationId']}/messages",
            json={"content": "do everything", "model": "scripted:all"},
        )
    ).json()
    events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed"
    assert rebuild_output(events) == "All done."

    finished = {
        e.data["data"]["toolCallId"]: e.data
        for e in events
        if e.event in ("tool.completed", "tool.failed")
    }
    assert {
        k: v["data"].get("errorType") for k, v in finished.items() if k in EXPECTED_FAILURES
    } == (EXPECTED_FAILURES)
    assert "the widget exploded" in finished["c_error"]["data"]["error"]
    assert "within 0.3 s" in finished["c_timeout"]["data"]["error"]
    assert finished["c_ok"]["data"]["output"] == "42"
    assert finished["c_big"]["data"]["truncated"] is True
    assert finished["c_big"]["data"]["outputChars"] == 40_000

    started = {
        e.data["data"]["toolCallId"]: e.data["data"] for e in events if e.event == "tool.started"
    }
    assert started["c_login"]["args"] == {"user": "[redacted]", "password": "[redacted]"}
    assert "hunter2" not in json.dumps([e.data for e in events])

    # The model read every outcome as a tool message; the big result was cut with a note.
    state = await app[0].state.graph.aget_state(
        {"configurable": {"thread_id": conv["conversationId"]}}
    )
    messages = {m.tool_call_id: m for m in state.values["messages"] if isinstance(m, ToolMessage)}
    assert set(messages) == {c.id for c in CALLS}
    assert messages["c_permission"].status == "error"
    assert "vault:read" in str(messages["c_permission"].content)
    assert "unexpected argument(s) expr" in str(messages["c_schema"].content)
    big_text = str(messages["c_big"].content)
    assert len(big_text) < 1200 and "[cut: showing the first 1000 of 40000 characters" in big_text
    # The model was only shown the tools it may call.
    shown = state.values["context_manifest"]["tools"]
    assert "forbidden_tool" not in shown and "secret" not in shown and "calculator" in shown

    # The full result is kept in the ledger for the trace.
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tool_call_id, status, length(output) AS n FROM tool_ledger WHERE run_id = %s",
            (run["runId"],),
        )
        ledger = {r["tool_call_id"]: r for r in await cur.fetchall()}
    assert ledger["c_big"]["n"] == 40_000
    assert ledger["c_timeout"]["status"] == "failed"
    assert "c_unknown" not in ledger  # refused before execution: nothing to dedupe

    snapshot = (await client.get(run["snapshotUrl"])).json()
    statuses = {t["toolCallId"]: t["status"] for t in snapshot["toolCalls"]}
    assert statuses["c_ok"] == "completed" and statuses["c_timeout"] == "failed"


async def test_tool_listing_shows_policy_per_tool(client: httpx.AsyncClient) -> None:
    listing: dict[str, Any] = (await client.get("/api/tools")).json()
    tools_by_name = {t["name"]: t for t in listing["tools"]}
    assert tools_by_name["forbidden_tool"]["allowed"] is False
    assert tools_by_name["secret"]["permitted"] is False
    assert tools_by_name["calculator"]["inputSchema"]["required"] == ["expression"]
    assert tools_by_name["slow"]["timeoutS"] == 0.3


async def test_a_run_can_narrow_its_tools(client: httpx.AsyncClient) -> None:
    conv = (await client.post("/api/conversations", json={})).json()
    run = (
        await client.post(
            f"/api/conversations/{conv['conversationId']}/messages",
            json={"content": "x", "model": "scripted:all", "options": {"tools": ["calculator"]}},
        )
    ).json()
    events = await read_sse(client, run["streamUrl"])
    failed = {
        e.data["data"]["toolCallId"]: e.data["data"] for e in events if e.event == "tool.failed"
    }
    assert failed["c_big"]["errorType"] == "forbidden"
    assert events[-1].event == "run.completed"
