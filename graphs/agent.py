"""The agent graph: build_context -> call_model -> [await_approval ->] dispatch_tools -> ... END."""

from __future__ import annotations

from typing import Literal

from langchain_core.messages import AIMessage
from langgraph.graph import START, StateGraph
from langgraph.runtime import Runtime

from graphs.context import RunContext
from graphs.state import AgentState
from nodes.await_approval import await_approval, pending_approvals, toolbox_of
from nodes.build_context import build_context
from nodes.call_model import call_model
from nodes.dispatch_tools import dispatch_tools


def route_after_model(
    state: AgentState, runtime: Runtime[RunContext]
) -> Literal["await_approval", "dispatch_tools", "__end__"]:
    """Finish when the model asked for no tool; stop for approval first when policy says so."""
    last = state["messages"][-1]
    if not (isinstance(last, AIMessage) and last.tool_calls):
        return "__end__"
    toolbox = toolbox_of(runtime.context or RunContext())
    return "await_approval" if pending_approvals(state, toolbox) else "dispatch_tools"


def build_agent_graph() -> StateGraph[AgentState, RunContext, AgentState, AgentState]:
    """Return the uncompiled agent loop; callers compile it with their checkpointer."""
    builder = StateGraph(AgentState, context_schema=RunContext)
    builder.add_node(build_context)
    builder.add_node(call_model)
    builder.add_node(await_approval)
    builder.add_node(dispatch_tools)
    builder.add_edge(START, "build_context")
    builder.add_edge("build_context", "call_model")
    builder.add_conditional_edges("call_model", route_after_model)
    builder.add_edge("await_approval", "dispatch_tools")
    builder.add_edge("dispatch_tools", "build_context")
    return builder


# Compiled without a checkpointer for LangGraph tooling (`langgraph.json`); the server compiles
# the same builder with the Postgres checkpointer.
graph = build_agent_graph().compile()
