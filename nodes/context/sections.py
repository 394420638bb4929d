"""Context sections: typed providers in a registry, so new sections need no change to the node.

A section provider is an async function from a `SectionRequest` to the section's items
(texts). The registry orders the sections in the system prompt and says, for each, its
priority (higher is kept first when the total does not fit) and its default token budget.
Later features (skills, memory, knowledge, the plan) register their providers here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from langchain_core.messages import BaseMessage

# Where the built-in and the planned sections sit in the system prompt.
ORDER_INSTRUCTIONS = 0
ORDER_IDENTITY = 10
ORDER_SKILLS = 20
ORDER_MEMORY = 30
ORDER_KNOWLEDGE = 40
ORDER_PLAN = 50


@dataclass(frozen=True)
class SectionRequest:
    """What a provider may read to build its section for one model call.

    Attributes:
        messages: The conversation so far (history and the current turn).
        run_id, conversation_id, tenant_id, user_id: Who and where.
        display_names: Known display names, by `tenant` and `user`.
        instructions: The agent profile's instructions.
        now: The time of this model call.
        options: The profile's settings for sections (`skills`, `memory`...), by section.
        state: The graph state (read-only), for sections that show it (plan, loaded skills).
    """

    messages: Sequence[BaseMessage]
    run_id: str
    conversation_id: str
    tenant_id: str
    user_id: str
    instructions: str
    now: datetime
    display_names: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, object] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)


class SectionItems(list[str]):
    """A provider's items with what the manifest should say of each (ids, scores).

    `details[i]` describes item `i`; the manifest lists the details of the items kept.
    """

    def __init__(self, items: Iterable[str] = (), details: Iterable[dict[str, object]] = ()):
        super().__init__(items)
        self.details = list(details)


SectionProvider = Callable[[SectionRequest], Awaitable[list[str]]]


@dataclass(frozen=True)
class SectionSpec:
    """A registered section.

    Attributes:
        name: Its name in budgets and the manifest.
        provider: Builds its items.
        order: Its place in the system prompt (lower first).
        priority: Higher is kept first when the sections do not all fit.
        budget: Default token budget (a profile may override it); None: no own limit.
        required: Never dropped whole (the instructions).
        frame: Text put before and after the section's kept items (joined by newlines),
            so that the model sees where the section starts and ends.
    """

    name: str
    provider: SectionProvider
    order: int
    priority: int
    budget: int | None = None
    required: bool = False
    frame: tuple[str, str] | None = None


class SectionRegistry:
    """The sections a build uses, in prompt order; immutable, `with_section` adds one."""

    def __init__(self, specs: Iterable[SectionSpec] = ()) -> None:
        self._specs: dict[str, SectionSpec] = {}
        for spec in specs:
            if spec.name in self._specs:
                raise ValueError(f"section {spec.name!r} is registered twice")
            self._specs[spec.name] = spec

    def with_section(self, spec: SectionSpec) -> SectionRegistry:
        """Return a registry with `spec` added (or replacing the section of the same name)."""
        specs = {**self._specs, spec.name: spec}
        return SectionRegistry(specs.values())

    def with_budgets(self, budgets: Mapping[str, int]) -> SectionRegistry:
        """Return a registry whose sections take their budgets from `budgets` where named."""
        return SectionRegistry(
            replace(s, budget=budgets.get(s.name, s.budget)) for s in self._specs.values()
        )

    def specs(self) -> list[SectionSpec]:
        """Return the sections in prompt order."""
        return sorted(self._specs.values(), key=lambda s: (s.order, s.name))

    def names(self) -> list[str]:
        """Return the section names in prompt order."""
        return [s.name for s in self.specs()]


async def instructions_section(request: SectionRequest) -> list[str]:
    """The system prompt: the agent profile's instructions."""
    return [request.instructions] if request.instructions.strip() else []


async def identity_section(request: SectionRequest) -> list[str]:
    """Who the agent works for, and the current time (UTC)."""
    tenant = request.display_names.get("tenant")
    user = request.display_names.get("user")
    tenant_text = f"{tenant} ({request.tenant_id})" if tenant else request.tenant_id
    user_text = f"{user} ({request.user_id})" if user else request.user_id
    when = request.now.strftime("%Y-%m-%d %H:%M UTC (%A)")
    return [f"You are working for user {user_text} of tenant {tenant_text}. It is now {when}."]


def default_registry() -> SectionRegistry:
    """The built-in sections: the instructions and the identity with the current time."""
    return SectionRegistry(
        [
            SectionSpec(
                "instructions", instructions_section, ORDER_INSTRUCTIONS, 100, required=True
            ),
            SectionSpec("identity", identity_section, ORDER_IDENTITY, 90, budget=200),
        ]
    )
