"""The `dispatch_tools` node: run the last model turn's tool calls concurrently."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.runtime import Runtime

from graphs.context import RunContext
from graphs.state import AgentState


async def run_tool_call(
    call: ToolCall, tools: dict[str, BaseTool], timeout_s: float, emit: Any
) -> ToolMessage:
    """Execute one tool call, emitting `tool.*` events; failures become error tool messages."""
    call_id = call["id"] or ""
    emit(
        {"event": "tool.started", "toolCallId": call_id, "name": call["name"], "args": call["args"]}
    )
    started = time.perf_counter()
    tool = tools.get(call["name"])
    try:
        if tool is None:
            raise LookupError(
                f"unknown tool {call['name']!r}; available: {', '.join(sorted(tools))}"
            )
        output = await asyncio.wait_for(tool.ainvoke(call["args"]), timeout_s)
    except TimeoutError:
        error = f"the tool did not finish within {timeout_s:g} s"
    except Exception as exc:  # a tool failure is reported to the model, not raised
        error = str(exc) or type(exc).__name__
    else:
        content = output if isinstance(output, str) else str(output)
        emit(
            {
                "event": "tool.completed",
                "toolCallId": call_id,
                "name": call["name"],
                "durationMs": round((time.perf_counter() - started) * 1000, 3),
                "output": content,
            }
        )
        return ToolMessage(content=content, tool_call_id=call_id, name=call["name"])
    emit(
        {
            "event": "tool.failed",
            "toolCallId": call_id,
            "name": call["name"],
            "durationMs": round((time.perf_counter() - started) * 1000, 3),
            "error": error,
        }
    )
    return ToolMessage(content=error, tool_call_id=call_id, name=call["name"], status="error")


async def dispatch_tools(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Run every tool call of the last model turn concurrently and append their results."""
    context = runtime.context or RunContext()
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    tools = {t.name: t for t in context.tools}
    results = await asyncio.gather(
        *(
            run_tool_call(call, tools, context.tool_timeout_s, runtime.stream_writer)
            for call in last.tool_calls
        )
    )
    return {"messages": list(results)}
