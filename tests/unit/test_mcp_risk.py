"""MCP tool annotations set the risk: destructive tools are high risk unless configured."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import StructuredTool

from tools.config import McpServerConfig
from tools.mcp import _specs


def mcp_tool(name: str, **hints: Any) -> StructuredTool:
    """A tool as langchain-mcp-adapters builds it: MCP annotations in `metadata`."""

    def run(record_id: str) -> str:
        return record_id

    return StructuredTool.from_function(
        run, name=name, description="d", metadata={"title": None, **hints}
    )


def risks(config: dict[str, Any]) -> dict[str, str]:
    tools = [
        mcp_tool("delete_record", destructiveHint=True),
        mcp_tool("read_record", readOnlyHint=True, destructiveHint=True),
        mcp_tool("plain"),
    ]
    parsed = McpServerConfig.model_validate({"transport": "stdio", "command": "x", **config})
    return {spec.name: spec.risk for spec in _specs("crm", parsed, tools)}


def test_a_destructive_tool_is_high_risk_by_default() -> None:
    assert risks({}) == {"delete_record": "high", "read_record": "medium", "plain": "medium"}


@pytest.mark.parametrize("risk", ["low", "medium"])
def test_a_configured_server_risk_applies_to_destructive_tools_too(risk: str) -> None:
    assert set(risks({"risk": risk}).values()) == {risk}


def test_a_per_tool_override_wins_over_the_hint() -> None:
    assert risks({"tools": {"delete_record": {"risk": "medium"}}})["delete_record"] == "medium"
