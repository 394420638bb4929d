"""The `build_context` node: enforce the step limit and assemble what the model will see."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage
from langgraph.runtime import Runtime

from graphs.context import RunContext
from graphs.state import AgentState
from nodes.errors import StepLimitError


def assemble_messages(state: AgentState, context: RunContext) -> list[BaseMessage]:
    """Return the messages for the next model call: system prompt, then the conversation."""
    return [SystemMessage(context.system_prompt), *state["messages"]]


async def build_context(state: AgentState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Refuse to go past the step limit and record the context manifest for the next call."""
    context = runtime.context or RunContext()
    step = state.get("step", 0)
    if step >= context.max_steps:
        raise StepLimitError(
            f"the agent made {step} model calls without a final answer; "
            f"the limit is {context.max_steps} (run option maxSteps)"
        )
    messages = assemble_messages(state, context)
    manifest = {
        "step": step + 1,
        "sections": [
            {"name": "system_prompt", "chars": len(context.system_prompt)},
            {"name": "history", "messages": len(state["messages"])},
        ],
        "tools": [t.name for t in context.tools],
        "messages": len(messages),
    }
    return {"context_manifest": manifest}
