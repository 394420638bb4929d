"""The `build_context` node: enforce the step limit and assemble what the model will see."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from langgraph.runtime import Runtime

from graphs.context import RunContext
from graphs.events import EventType
from graphs.state import AgentState
from nodes.context.engine import Built, build
from nodes.context.metadata import PURPOSE_KEY, STEP_KEY, call_metadata
from nodes.context.sections import SectionRequest
from nodes.context.setup import ContextSetup
from nodes.context.tokens import tools_tokens
from nodes.errors import StepLimitError
from nodes.state_tools import preload, visible_tools


def context_setup(context: RunContext) -> ContextSetup:
    """Return the run's context setup (the defaults when the run gave none)."""
    setup = context.context_setup
    if setup is None:
        return ContextSetup()
    if not isinstance(setup, ContextSetup):
        raise TypeError(f"RunContext.context_setup must be a ContextSetup, not {type(setup)}")
    return setup


async def assemble(
    state: AgentState, context: RunContext, emit: Callable[[Any], None], step: int
) -> Built:
    """Build the model's input for `step` from the state and the run's context setup."""
    setup = context_setup(context)
    messages = state["messages"]
    request = SectionRequest(
        messages=messages,
        run_id=context.run_id,
        conversation_id=context.conversation_id,
        tenant_id=context.tenant_id,
        user_id=context.user_id,
        instructions=context.system_prompt,
        now=datetime.now(UTC),
        display_names=setup.display_names,
        options=setup.section_options,
        state=state,
    )
    tools = visible_tools(state, context.tools)
    built = await build(
        messages,
        setup,
        request,
        tools_tokens=tools_tokens(tools, setup.counter),
        counts=state.get("token_counts") or {},
        emit=emit,
        step=step,
        attempt=context.attempt,
    )
    built.manifest["tools"] = [t.name for t in tools]  # what the model is shown
    return built


async def build_context(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Refuse to go past the step limit, then assemble the next call's input once.

    The input waits in `context.prepared` for `call_model`; the manifest is emitted as a
    `context.built` event and kept in the state with the new messages' token counts.
    """
    context = runtime.context or RunContext()
    step = state.get("step", 0)
    if step >= context.max_steps:
        raise StepLimitError(
            f"the agent made {step} model calls without a final answer; "
            f"the limit is {context.max_steps} (run option maxSteps)"
        )
    loaded = await preload(state, context, runtime.stream_writer)
    if loaded:
        state = {**state, **loaded}  # type: ignore[typeddict-item]
    with call_metadata(**{STEP_KEY: step + 1, PURPOSE_KEY: "summary"}):
        built = await assemble(state, context, runtime.stream_writer, step + 1)
    context.prepared.clear()
    context.prepared[step + 1] = built.messages
    runtime.stream_writer({"event": EventType.CONTEXT_BUILT, **built.manifest})
    update: dict[str, Any] = {"context_manifest": built.manifest, **loaded}
    if built.counts:
        update["token_counts"] = built.counts
    # Building again costs a later attempt no side effect (a summary is kept in its own
    # store), so this step's checkpoint may go with the model call's.
    context.checkpoint_may_wait()
    return update
