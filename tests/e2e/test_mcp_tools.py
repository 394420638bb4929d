"""MCP servers' tools are discovered per tenant and called through the same pipeline."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support import mcp_server
from tests.support.live import free_port, read_sse, serve
from tools.config import ToolConfig

SERVER_SCRIPT = Path(mcp_server.__file__)
CALLS = [
    ScriptedToolCall(id="m_add", name="local_add", args={"a": 2, "b": 3}),
    ScriptedToolCall(id="m_schema", name="local_add", args={"a": "two", "b": 3}),
    ScriptedToolCall(id="m_fail", name="local_fail", args={"reason": "disk on fire"}),
    ScriptedToolCall(id="m_down", name="down_ping", args={}),
    ScriptedToolCall(id="m_http", name="web_shout", args={"text": "hello"}),
]
SCRIPTS = {"mcp": [ScriptedTurn(tool_calls=CALLS), ScriptedTurn(text="MCP done.")]}


@pytest.fixture(scope="module")
async def http_mcp() -> AsyncIterator[str]:
    """A real MCP server over streamable HTTP on a loopback port."""
    async with serve(mcp_server.build("web").streamable_http_app()) as url:  # type: ignore[arg-type]
        yield f"{url}/mcp"


@pytest.fixture(scope="module")
async def client(settings: Settings, http_mcp: str) -> AsyncIterator[httpx.AsyncClient]:
    config = ToolConfig.model_validate(
        {
            "default": {
                "mcp_servers": {
                    "local": {
                        "transport": "stdio",
                        "command": sys.executable,
                        "args": [str(SERVER_SCRIPT)],
                        "prefix": True,
                    },
                    "down": {
                        "transport": "streamable_http",
                        "url": f"http://127.0.0.1:{free_port()}/mcp",
                        "prefix": True,
                        "discovery_timeout_s": 5,
                    },
                }
            }
        }
    )
    custom = settings.model_copy(
        update={"tool_config": config, "mcp_api_allowed_hosts": ["127.0.0.1"]}
    )
    app = create_app(custom, models=ModelRegistry(custom, SCRIPTS))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as c:
        # The HTTP server is added by the tenant admin through the API.
        response = await c.put(
            "/api/tools/config",
            json={
                "mcp_servers": {
                    "web": {"transport": "streamable_http", "url": http_mcp, "prefix": True}
                }
            },
        )
        assert response.status_code == 200, response.text
        yield c


async def test_mcp_tools_are_listed_with_configured_policy(client: httpx.AsyncClient) -> None:
    listing: dict[str, Any] = (await client.get("/api/tools")).json()
    tools = {t["name"]: t for t in listing["tools"]}
    assert {"local_add", "local_shout", "local_fail", "web_shout", "calculator"} <= set(tools)
    assert tools["local_add"]["source"] == "mcp:local"
    assert tools["local_add"]["risk"] == "medium"
    assert tools["local_add"]["idempotent"] is True  # the server marks it read-only
    assert tools["local_shout"]["idempotent"] is False
    assert tools["local_delete_record"]["risk"] == "high"
    assert tools["local_delete_record"]["approvalRequired"] is True
    assert tools["local_add"]["inputSchema"]["required"] == ["a", "b"]
    (down,) = listing["unavailable"]
    assert down["source"] == "mcp:down" and "not reachable" in down["reason"]


async def test_mcp_tools_are_called_through_the_pipeline(client: httpx.AsyncClient) -> None:
    conv = (await client.post("/api/conversations", json={})).json()
    run = (
        await client.post(
            f"/api/conversations/{conv['conversationId']}/messages",
            json={"content": "use mcp", "model": "scripted:mcp"},
        )
    ).json()
    events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed"
    unavailable = [e.data["data"] for e in events if e.event == "tools.unavailable"]
    assert [u["source"] for u in unavailable] == ["mcp:down"]
    done = {
        e.data["data"]["toolCallId"]: e.data["data"]
        for e in events
        if e.event in ("tool.completed", "tool.failed")
    }
    assert done["m_add"]["output"] == "5"
    assert done["m_http"]["output"] == "HELLO"
    assert done["m_schema"]["errorType"] == "invalid_arguments"
    assert done["m_fail"]["errorType"] == "tool_error"
    assert "disk on fire" in done["m_fail"]["error"]
    assert done["m_down"]["errorType"] == "unavailable"
    assert "MCP server 'down' is not reachable" in done["m_down"]["error"]


async def test_the_api_refuses_mcp_servers_that_could_run_commands_or_reach_any_host(
    client: httpx.AsyncClient,
) -> None:
    stdio = {"mcp_servers": {"x": {"transport": "stdio", "command": "/bin/sh"}}}
    response = await client.put("/api/tools/config", json=stdio)
    assert response.status_code == 422
    assert "only the operator" in response.json()["error"]["message"]
    elsewhere = {
        "mcp_servers": {"x": {"transport": "streamable_http", "url": "http://10.0.0.1/mcp"}}
    }
    response = await client.put("/api/tools/config", json=elsewhere)
    assert response.status_code == 422
    assert "AGENTRT_MCP_API_ALLOWED_HOSTS" in response.json()["error"]["message"]
