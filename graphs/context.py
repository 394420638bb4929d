"""The per-run context handed to every node through `Runtime[RunContext]`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import BaseTool

from tools.artifacts.api import ArtifactSink
from tools.policy import Toolbox

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant running inside agentrt. Use the tools you are given when they "
    "help, and answer plainly."
)


class ModelCaller(Protocol):
    """The one interface `call_model` uses, whatever the provider (nodes/models/caller.py).

    It owns retries, timeouts, fallbacks, the circuit breakers, the usage ledger events and
    the run's budgets; the node only hands it the messages and tools.
    """

    async def call(
        self,
        messages: Sequence[BaseMessage],
        tools: Sequence[BaseTool],
        emit: Callable[[Any], None],
        *,
        step: int,
    ) -> AIMessage:
        """Call the model with `messages` and `tools`; return its answer."""
        ...


@dataclass(frozen=True)
class RunContext:
    """Everything a run needs that is not graph state: identity, model, tools and limits.

    `tools` are what the model is shown; `toolbox` governs every call (policy, ledger). The
    server builds both from the same catalogue; without a toolbox, `tools` are run as low-risk
    tools with an in-memory ledger.

    `system_prompt` is the agent profile's instructions; `context_setup` says how the model's
    input is assembled (docs/context.md). It is not checkpointed; the server rebuilds it for
    every attempt. Defaults run the graph with the offline demo model.
    """

    run_id: str = "local"
    conversation_id: str = "local"
    tenant_id: str = "default"
    user_id: str = "local"
    model: BaseChatModel | None = None
    model_caller: ModelCaller | None = None
    tools: Sequence[BaseTool] = field(default_factory=tuple)
    toolbox: Toolbox | None = None
    max_steps: int = 12
    tool_timeout_s: float = 30.0
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    attempt: int = 1
    # A nodes.context.setup.ContextSetup; typed loosely so this schema imports only leaves.
    context_setup: object | None = None
    # The input build_context made for each step, taken by call_model (not checkpointed).
    prepared: dict[int, list[BaseMessage]] = field(default_factory=dict, compare=False)
    # Where the run's tools store artifacts (docs/artifacts.md); None: no artifact storage.
    artifacts: ArtifactSink | None = None
    # Told by the router, before the step's checkpoint, that the model's turn ends the run:
    # the server then stores that last checkpoint with the run's end (docs/decisions/2021).
    ending: Callable[[], None] | None = field(default=None, compare=False)
    # Told by a node whose work a later attempt may do again at no cost (build_context,
    # dispatch_tools) that its step's checkpoint may wait for the next one's: the server then
    # stores the two in one transaction (docs/decisions/2022).
    deferring: Callable[[], None] | None = field(default=None, compare=False)

    def checkpoint_may_wait(self) -> None:
        """Say, from a node, that its step's checkpoint may go with the next one's.

        Only for a node that a later attempt may run again at no cost: a crash before the
        next checkpoint is stored finds neither, and that attempt runs the node again.
        """
        if self.deferring is not None:
            self.deferring()
