"""The `call_model` node: one model call over the assembled context."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from graphs.context import RunContext
from graphs.state import AgentState
from nodes.build_context import assemble_messages
from nodes.models.demo import DemoChatModel


async def call_model(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Call the model with the run's tools bound; tokens stream via LangGraph's messages mode."""
    context = runtime.context or RunContext()
    model = context.model or DemoChatModel()
    bound = model.bind_tools(list(context.tools)) if context.tools else model
    response = await bound.ainvoke(assemble_messages(state, context))
    return {"messages": [response], "step": state.get("step", 0) + 1}
