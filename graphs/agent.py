"""The agent graph: build_context -> call_model -> (dispatch_tools -> build_context)* -> END."""

from __future__ import annotations

from typing import Literal

from langchain_core.messages import AIMessage
from langgraph.graph import START, StateGraph

from graphs.context import RunContext
from graphs.state import AgentState
from nodes.build_context import build_context
from nodes.call_model import call_model
from nodes.dispatch_tools import dispatch_tools


def route_after_model(state: AgentState) -> Literal["dispatch_tools", "__end__"]:
    """Go to the tools when the model asked for any, else finish."""
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and last.tool_calls:
        return "dispatch_tools"
    return "__end__"


def build_agent_graph() -> StateGraph[AgentState, RunContext, AgentState, AgentState]:
    """Return the uncompiled agent loop; callers compile it with their checkpointer."""
    builder = StateGraph(AgentState, context_schema=RunContext)
    builder.add_node(build_context)
    builder.add_node(call_model)
    builder.add_node(dispatch_tools)
    builder.add_edge(START, "build_context")
    builder.add_edge("build_context", "call_model")
    builder.add_conditional_edges("call_model", route_after_model)
    builder.add_edge("dispatch_tools", "build_context")
    return builder


# Compiled without a checkpointer for LangGraph tooling (`langgraph.json`); the server compiles
# the same builder with the Postgres checkpointer.
graph = build_agent_graph().compile()
