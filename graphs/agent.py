"""The agent graph: build_context -> call_model -> [await_approval ->] dispatch_tools ... END.

After dispatch_tools, a turn's `delegate` calls go to delegate_subagents (child runs).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime, get_runtime

from graphs.context import RunContext
from graphs.state import AgentState
from nodes.await_approval import await_approval, pending_approvals, toolbox_of
from nodes.build_context import build_context
from nodes.call_model import call_model
from nodes.delegate_subagents import delegate_subagents, open_delegations
from nodes.dispatch_tools import dispatch_tools

Route = Literal["await_approval", "dispatch_tools", "__end__"]


async def route_after_model(state: AgentState) -> Route:
    """Finish when the model asked for no tool; stop for approval first when policy says so.

    The run's context comes from `get_runtime`, not from a `runtime` parameter: LangGraph
    routes a state update made outside a run (the LangGraph API's `update_state`) with no
    runtime, and refuses to call a router that asks for one.

    The routers are coroutines, as the nodes are: LangGraph runs a plain function of an async
    graph in a thread, a hop that cost more than the routing (docs/decisions/2016).
    """
    return route_with(state, get_runtime(RunContext))


def route_with(state: AgentState, runtime: Runtime[RunContext] | None) -> Route:
    """Route after the model with the run's runtime, or None outside a run.

    Outside a run the approval policy is unknown: tool calls go through `await_approval`,
    which asks for what the policy of the run that resumes them requires, and nothing more.
    """
    # A state written by hand (supersteps as the model call) may hold no message at all.
    last = state["messages"][-1] if state.get("messages") else None
    if not (isinstance(last, AIMessage) and last.tool_calls):
        if runtime is not None and runtime.context is not None and runtime.context.ending:
            runtime.context.ending()  # the checkpoint of this step is the run's last
        return "__end__"
    if runtime is None:
        return "await_approval"
    toolbox = toolbox_of(runtime.context or RunContext())
    return "await_approval" if pending_approvals(state, toolbox) else "dispatch_tools"


async def route_after_tools(state: AgentState) -> Literal["delegate_subagents", "build_context"]:
    """Hand the turn's `delegate` calls to child runs before the next model call."""
    return "delegate_subagents" if open_delegations(state) else "build_context"


ContextFactory = Callable[[RunContext | None], Awaitable[RunContext]]


async def _completed(runtime: Runtime[RunContext], factory: ContextFactory) -> Runtime[RunContext]:
    """Return `runtime` with a full context: its own, or one `factory` builds from it."""
    context = runtime.context
    if context is None or context.model_caller is None:
        return runtime.override(context=await factory(context))
    return runtime


def _with_context(node: Any, factory: ContextFactory) -> Any:
    """Wrap a node so that a run started without a full context gets one from `factory`."""

    async def wrapped(state: AgentState, runtime: Runtime[RunContext]) -> Any:
        result = node(state, await _completed(runtime, factory))
        return await result if inspect.isawaitable(result) else result

    wrapped.__name__ = node.__name__
    return wrapped


def _router_with_context(factory: ContextFactory) -> Any:
    """`route_after_model` for runs started without a full context (see `_with_context`)."""

    async def route_after_model(state: AgentState) -> Route:
        runtime = get_runtime(RunContext)
        return route_with(state, None if runtime is None else await _completed(runtime, factory))

    return route_after_model


def build_agent_graph(
    context: ContextFactory | None = None,
) -> StateGraph[AgentState, RunContext, AgentState, AgentState]:
    """Return the uncompiled agent loop; callers compile it with their checkpointer.

    Args:
        context: Builds the run context of runs started without one (`langgraph dev`); the
            server always passes a full context and leaves this unset.
    """
    builder = StateGraph(AgentState, context_schema=RunContext)
    nodes: list[Any] = [
        build_context,
        call_model,
        await_approval,
        dispatch_tools,
        delegate_subagents,
    ]
    router: Any = route_after_model
    if context is not None:
        nodes = [_with_context(n, context) for n in nodes]
        router = _router_with_context(context)
    for node in nodes:
        builder.add_node(node.__name__, node)
    builder.add_edge(START, "build_context")
    builder.add_edge("build_context", "call_model")
    builder.add_conditional_edges(
        "call_model",
        router,
        {"await_approval": "await_approval", "dispatch_tools": "dispatch_tools", END: END},
    )
    builder.add_edge("await_approval", "dispatch_tools")
    # Subagents: the turn's `delegate` calls run as child runs after its other tools.
    builder.add_conditional_edges(
        "dispatch_tools",
        route_after_tools,
        {"delegate_subagents": "delegate_subagents", "build_context": "build_context"},
    )
    builder.add_edge("delegate_subagents", "build_context")
    return builder


# Compiled without a checkpointer for LangGraph tooling (`langgraph.json`); the server compiles
# the same builder with the Postgres checkpointer.
graph = build_agent_graph().compile()
