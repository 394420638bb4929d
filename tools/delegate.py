"""The `delegate` tool: hand a task to a subagent, which runs as a child run of its own.

The tool only declares what the model may ask for; the graph's `delegate_subagents` node
carries the calls out (the parent waits without holding a worker, docs/subagents.md), so the
function below never runs inside an agent run.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.tools import ToolException

from tools.spec import ToolSpec, agent_tool

DELEGATE_TOOL = "delegate"


@agent_tool(name=DELEGATE_TOOL, max_output_chars=16_000)
async def delegate(
    task: str,
    agent: str | None = None,
    expected_output: str | None = None,
    output_schema: dict[str, Any] | None = None,
    tools: list[str] | None = None,
    budget_share: float | None = None,
    on_failure: Literal["tool_error", "fail"] = "tool_error",
) -> str:
    """Hand a self-contained task to a subagent and get its final answer back.

    The subagent starts from nothing but `task`: say everything it needs. Several delegate
    calls in one turn run in parallel. Use it for work a specialised agent does better, or
    to split a large job into independent parts.

    Args:
        task: The complete task for the subagent, with all the context it needs.
        agent: The agent profile to use (for example "researcher"); your own when omitted.
        expected_output: What the answer should contain or look like.
        output_schema: A JSON schema the subagent's final answer must satisfy (it then
            answers with JSON only).
        tools: Restrict the subagent to these of your tools.
        budget_share: The share (0 to 1) of your remaining budget the subagent may spend.
        on_failure: "tool_error" to get a failure back as this call's error, or "fail" to
            fail your own run with it.
    """
    raise ToolException("delegate runs only inside an agent graph with subagents")


def delegate_tools() -> list[ToolSpec]:
    """Return the subagent tools."""
    return [delegate]
