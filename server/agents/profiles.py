"""Agent profiles: what an agent is (instructions, model, tools, limits, context policy).

A profile is named per tenant and versioned: every change stores a new immutable version,
and a run records the exact version it used. A reference is `name` (the latest version) or
`name@version`. The built-in `default` profile (version 0) reproduces the behaviour of a
server without profiles: the default instructions, the server's model, every tool the tenant
allows, and the server's limits.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from graphs.context import DEFAULT_SYSTEM_PROMPT
from nodes.context.setup import DEFAULT_MAX_ITEM_TOKENS, DEFAULT_RESERVE_OUTPUT, ContextPolicy
from server.errors import BadAgentReferenceError
from tools.config import ToolOverride
from tools.jsontypes import JsonBool, JsonFloat, JsonInt, NotTextOrFlag

DEFAULT_AGENT = "default"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_REF = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_-]{0,62})(?:@(?P<version>[0-9]{1,9}))?$")


MaxSteps = Annotated[int, Field(ge=1, le=200), NotTextOrFlag]
"""The most steps a run may take, from 1 to 200."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel)


class SummaryPolicy(_Spec):
    """Running summaries of history that no longer fits (docs/context.md)."""

    enabled: JsonBool = False
    model: str | None = Field(
        default=None,
        description="The (cheap) model that writes summaries; the run's model when unset.",
    )
    max_tokens: JsonInt = Field(default=1_000, ge=50, le=32_000)
    input_tokens: JsonInt = Field(
        default=16_000,
        ge=500,
        le=1_000_000,
        description="The most transcript one summarising call reads.",
    )


class ContextSpec(_Spec):
    """How the model's input is assembled."""

    window: Annotated[int, Field(ge=1_024), NotTextOrFlag] | None = Field(
        default=None,
        description="The model's context window; from litellm's model map when unset.",
    )
    reserve_output_tokens: JsonInt = Field(default=DEFAULT_RESERVE_OUTPUT, ge=0, le=1_000_000)
    budgets: dict[str, Annotated[int, Field(ge=0), NotTextOrFlag]] = Field(
        default_factory=dict,
        description="Token budgets by section: instructions, identity, skills, memory, "
        "knowledge, plan, history.",
    )
    max_item_tokens: JsonInt = Field(default=DEFAULT_MAX_ITEM_TOKENS, ge=100, le=10_000_000)
    summary: SummaryPolicy = Field(default_factory=SummaryPolicy)

    @model_validator(mode="after")
    def _room_for_input(self) -> ContextSpec:
        if self.window is not None and self.reserve_output_tokens >= self.window // 2:
            raise ValueError(
                f"reserveOutputTokens ({self.reserve_output_tokens}) must be under half the "
                f"window ({self.window}), or no room is left for the conversation"
            )
        return self

    def policy(self) -> ContextPolicy:
        """Return the engine's policy for this spec."""
        return ContextPolicy(
            window=self.window,
            reserve_output_tokens=self.reserve_output_tokens,
            budgets=dict(self.budgets),
            max_item_tokens=self.max_item_tokens,
            summary=self.summary.enabled,
            summary_max_tokens=self.summary.max_tokens,
            summary_input_tokens=self.summary.input_tokens,
        )


class MemoryRecallSpec(_Spec):
    """Recall before a model call: which memories go into the `memory` section."""

    enabled: JsonBool = True
    limit: JsonInt = Field(default=8, ge=1, le=50)
    min_similarity: JsonFloat = Field(
        default=0.2, ge=-1.0, le=1.0, description="Less similar memories are left out."
    )
    recency_weight: JsonFloat = Field(default=0.15, ge=0.0, le=1.0)
    half_life_days: JsonFloat = Field(default=90.0, gt=0)
    include_shared: JsonBool = Field(default=True, description="Recall the tenant's shared facts.")


class MemorySpec(_Spec):
    """Long-term memory (docs/memory.md).

    `mode`: `off` (no memory at all: no recall, no tools, no extraction), `auto` (after every
    completed run a job extracts what is worth keeping, and the tools are offered), or `tool`
    (only the `remember`/`recall`/`forget` tools write and read).
    """

    mode: Literal["off", "auto", "tool"] = "off"
    extraction_model: str | None = Field(
        default=None,
        description="The model that extracts memories; AGENTRT_MEMORY_EXTRACTION_MODEL, "
        "else the run's model, when unset.",
    )
    recall: MemoryRecallSpec = Field(default_factory=MemoryRecallSpec)
    tenant_write_roles: list[str] = Field(
        default_factory=lambda: ["admin"],
        description="Roles whose runs may remember and forget the tenant's shared facts.",
    )
    duplicate_similarity: JsonFloat = Field(
        default=0.9,
        ge=0.0,
        le=1.0,
        description="An extracted memory this similar to a stored one updates it.",
    )


class AutoSelectSpec(_Spec):
    """Load the skill whose description best matches the message (lexical similarity)."""

    enabled: JsonBool = False
    min_similarity: JsonFloat = Field(default=0.3, ge=0.0, le=1.0)


class SkillsSpec(_Spec):
    """Which skills the agent may use (docs/skills.md); a plain list is read as `allowed`."""

    allowed: list[str] = Field(
        default_factory=list,
        description="Skill names the agent may load; ['*'] for every skill the tenant has "
        "enabled; none when empty (no skill tools, no skills section).",
    )
    preload: list[str] = Field(
        default_factory=list, description="Skills loaded before the first model call."
    )
    auto_select: AutoSelectSpec = Field(default_factory=lambda: AutoSelectSpec())

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        return {"allowed": value} if isinstance(value, list) else value

    @model_validator(mode="after")
    def _preload_allowed(self) -> SkillsSpec:
        names = set(self.allowed)
        missing = [n for n in self.preload if "*" not in names and n not in names]
        if missing:
            raise ValueError(f"preloaded skills must be allowed too: {', '.join(missing)}")
        return self


class PlanSpec(_Spec):
    """The model's plan (docs/skills.md): the `update_plan` tool and the `plan` section."""

    enabled: JsonBool = Field(default=False, description="Offer update_plan and show the plan.")
    required: JsonBool = Field(
        default=False,
        description="Refuse tool calls from `requiredBeforeToolCall` on until a plan exists.",
    )
    required_before_tool_call: JsonInt = Field(default=2, ge=1, le=100)

    @model_validator(mode="after")
    def _required_enables(self) -> PlanSpec:
        if self.required:
            self.enabled = True
        return self


class KnowledgeSpec(_Spec):
    """Knowledge bases and retrieval (docs/knowledge.md).

    `mode`: `off` (no retrieval), `tool` (the `search_knowledge` tool), or `auto` (the tool,
    and before every model call the `knowledge` section retrieves evidence for the message).
    """

    mode: Literal["off", "tool", "auto"] = "off"
    knowledge_bases: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list,
        description="Knowledge bases (names) this agent searches; every one it may access "
        "when empty.",
    )
    top_k: JsonInt = Field(default=5, ge=1, le=20, description="Chunks per automatic retrieval.")
    min_score: JsonFloat = Field(
        default=0.0, ge=0.0, description="Automatic retrieval leaves out chunks scoring less."
    )
    rewrite_model: str | None = Field(
        default=None,
        description="A model that rewrites the message into a search query (auto mode); "
        "the message itself when unset.",
    )


class AgentSpec(_Spec):
    """The body of a profile version (`POST /api/agents`, `agents/*.yaml`)."""

    description: str | None = Field(default=None, max_length=2_000)
    instructions: str = Field(default=DEFAULT_SYSTEM_PROMPT, max_length=100_000)
    model: str | None = Field(
        default=None, description="Default model (`provider:model`); the server's when unset."
    )
    fallbacks: list[str] | None = Field(
        default=None,
        description="Models tried in order when the model fails; the server's "
        "AGENTRT_MODEL_FALLBACKS when unset.",
    )
    tools: list[str] | None = Field(
        default=None,
        description="Tool names this agent may use (of those the tenant allows); "
        "all of them when unset.",
    )
    tool_policies: dict[str, ToolOverride] = Field(
        default_factory=dict, description="Per-tool policy overrides (risk, approval, timeouts)."
    )
    skills: SkillsSpec = Field(default_factory=SkillsSpec)
    memory: MemorySpec = Field(default_factory=MemorySpec)
    retrieval: dict[str, Any] = Field(default_factory=dict)
    knowledge: KnowledgeSpec = Field(default_factory=KnowledgeSpec)
    context: ContextSpec = Field(default_factory=ContextSpec)
    plan: PlanSpec = Field(default_factory=PlanSpec)
    max_steps: MaxSteps | None = None
    run_timeout_seconds: JsonFloat | None = Field(default=None, gt=0, le=7 * 24 * 3600)


BUILTIN_DEFAULT = AgentSpec(description="The built-in agent: the server's defaults.")


def parse_ref(ref: str) -> tuple[str, int | None]:
    """Split `support` or `support@3` into (name, version or None).

    Raises:
        BadAgentReferenceError: anything else.
    """
    match = _REF.match(ref.strip())
    if match is None:
        raise BadAgentReferenceError(
            f"agent {ref!r} is not a profile reference: use a name such as 'support' (its "
            "latest version) or 'support@3' (version 3); names are lowercase letters, digits, "
            "'-' and '_'"
        )
    version = match["version"]
    return match["name"], None if version is None else int(version)
