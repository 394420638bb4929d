"""The `call_model` node: one model call over the assembled context."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from graphs.context import RunContext
from graphs.events import EventType
from graphs.state import AgentState
from nodes.build_context import assemble
from nodes.context.metadata import PURPOSE_KEY, STEP_KEY, call_metadata
from nodes.models.caller import ModelChoice, ResilientModelCaller
from nodes.models.demo import DemoChatModel
from nodes.state_tools import visible_tools


def default_caller(context: RunContext) -> ResilientModelCaller:
    """Wrap `context.model` (the demo model by default) for runs the server did not set up."""
    model = context.model or DemoChatModel()
    name = model.name or type(model).__name__
    return ResilientModelCaller([ModelChoice(name, name, name, model)])


async def call_model(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Call the run's model with its tools; retries, fallbacks and usage are the caller's.

    Tokens stream to clients via LangGraph's `messages` mode; the caller reports every attempt
    as a `usage` custom event and marks superseded partial answers (docs/events.md).
    """
    context = runtime.context or RunContext()
    caller = context.model_caller or default_caller(context)
    step = state.get("step", 0) + 1
    messages = context.prepared.pop(step, None)
    if messages is None:  # resumed after build_context's checkpoint: build it again, once
        built = await assemble(state, context, runtime.stream_writer, step)
        runtime.stream_writer({"event": EventType.CONTEXT_BUILT, **built.manifest})
        messages = built.messages
    with call_metadata(**{STEP_KEY: step, PURPOSE_KEY: "answer"}):
        tools = visible_tools(state, context.tools)
        response = await caller.call(messages, tools, runtime.stream_writer, step=step)
    return {"messages": [response], "step": step}
