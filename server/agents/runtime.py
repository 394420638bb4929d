"""What a run's agent profile decides at execution: instructions, tools, limits, context."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from nodes.context.knowledge import KNOWLEDGE_SECTION
from nodes.context.memory import MEMORY_SECTION
from nodes.context.plan import PLAN_SECTION
from nodes.context.sections import default_registry
from nodes.context.setup import DEFAULT_WINDOW, ContextSetup
from nodes.context.skills import LOADED_SKILLS_SECTION, SKILLS_SECTION
from nodes.context.summary import ModelSummarizer, SummaryStore
from nodes.context.tokens import EstimateCounter, FunctionCounter, TokenCounter, counter_for
from nodes.models.caller import ResilientModelCaller
from nodes.models.usage import Budget
from server.agents.store import AgentVersion
from server.db.pool import Pool
from server.domain import Run
from server.settings import Settings
from server.usage.pricing import load_litellm
from server.usage.registry import ModelRegistry
from skills.library import SkillLibrary
from skills.tools import SKILL_TOOLS
from tools.config import TenantToolConfig
from tools.delegate import DELEGATE_TOOL
from tools.knowledge.search import KnowledgeAccess, KnowledgeSearch
from tools.knowledge.tools import KNOWLEDGE_TOOLS
from tools.ledger import HeldOutcomes, PostgresToolLedger
from tools.memory.tools import MEMORY_TOOLS
from tools.plan.tool import PLAN_TOOLS
from tools.policy import Toolbox
from tools.registry import ToolRegistry

# LangGraph's tag that keeps a model call out of the `messages` stream (summaries are not
# part of the answer).
NOSTREAM = "nostream"


def _litellm_names(model_id: str) -> list[str]:
    provider, _, name = model_id.partition(":")
    if provider == "openai":
        return [name]
    if provider == "litellm":
        return [name, name.split("/", 1)[-1]]
    return []


def model_window(model_id: str, settings: Settings) -> int | None:
    """Return the model's input window from litellm's model map, if the map knows it."""
    names = _litellm_names(model_id)
    if not names:
        return None  # demo and scripted models: litellm is not even loaded for them
    cost = load_litellm(settings).model_cost
    for name in names:
        info = cost.get(name)
        if isinstance(info, dict):
            window = info.get("max_input_tokens") or info.get("max_tokens")
            if isinstance(window, int) and window > 0:
                return window
    return None


def model_counter(model_id: str, settings: Settings) -> TokenCounter:
    """Return the model's tokenizer: tiktoken for OpenAI models, litellm's for litellm ones."""
    provider, _, name = model_id.partition(":")
    if provider == "litellm":
        litellm = load_litellm(settings)
        short = name.split("/", 1)[-1]
        counter = counter_for(short, None)
        if not isinstance(counter, EstimateCounter):
            return counter

        def count(text: str) -> int:
            return int(litellm.token_counter(model=name, text=text))

        return counter_for(short, FunctionCounter(f"litellm:{name}", count))
    return counter_for(name or provider)


def without_streaming(caller: ResilientModelCaller, meter_of: ResilientModelCaller) -> Any:
    """Return `caller` tagged out of the token stream, sharing the run's usage meter."""
    choices = [
        replace(c, model=c.model.model_copy(update={"tags": [*(c.model.tags or []), NOSTREAM]}))
        for c in caller.choices
    ]
    return replace(caller, choices=choices, meter=meter_of.meter)


def memory_options(agent: AgentVersion, roles: Sequence[str]) -> dict[str, Any]:
    """Return the run's memory settings.

    They are the profile's, and whether the caller may change the tenant's shared memories
    (a role the profile names).
    """
    memory = agent.spec.memory
    may_write = bool(set(roles) & set(memory.tenant_write_roles))
    return {**memory.model_dump(), "tenant_write": may_write}


def knowledge_access(
    agent: AgentVersion,
    search: KnowledgeSearch | None,
    models: ModelRegistry,
    caller: ResilientModelCaller,
    roles: Sequence[str],
) -> KnowledgeAccess | None:
    """Return the run's knowledge access from its profile, None when knowledge is off."""
    policy = agent.spec.knowledge
    if policy.mode == "off" or search is None:
        return None
    rewriter = None
    if policy.rewrite_model:
        rewriter = without_streaming(models.caller(policy.rewrite_model), caller)
    budget = agent.spec.context.budgets.get("knowledge", KNOWLEDGE_SECTION.budget or 800)
    return KnowledgeAccess(
        search=search,
        profile=agent.name,
        roles=frozenset(roles),
        knowledge_bases=tuple(policy.knowledge_bases),
        mode=policy.mode,
        top_k=policy.top_k,
        budget=budget,
        rewrite_model=policy.rewrite_model,
        min_score=policy.min_score,
        rewriter=rewriter,
    )


def context_setup(
    agent: AgentVersion,
    model_id: str,
    *,
    models: ModelRegistry,
    settings: Settings,
    summaries: SummaryStore,
    caller: ResilientModelCaller,
    roles: Sequence[str] = (),
    skills: SkillLibrary | None = None,
    knowledge: KnowledgeSearch | None = None,
) -> ContextSetup:
    """Build the run's context setup from its profile version and model.

    `caller` is the run's model caller: summaries share its usage meter and budgets. `roles`
    are the roles of the run's principal (they may allow writing the tenant's memories, and
    searching knowledge bases). `skills` is the run's skill library (used when the profile
    allows skills); `knowledge` is the process's knowledge search.
    """
    spec = agent.spec
    summary = spec.context.summary
    summarizer = None
    if summary.enabled:
        summary_model = summary.model or model_id
        summarizer = ModelSummarizer(
            without_streaming(models.caller(summary_model), caller),
            summary_model,
            model_counter(summary_model, settings),
            summary.input_tokens,
        )
    registry = default_registry()
    if spec.memory.mode != "off":
        registry = registry.with_section(MEMORY_SECTION)
    if spec.skills.allowed and skills is not None:
        registry = registry.with_section(SKILLS_SECTION).with_section(LOADED_SKILLS_SECTION)
    if spec.plan.enabled:
        registry = registry.with_section(PLAN_SECTION)
    access = knowledge_access(agent, knowledge, models, caller, roles)
    if access is not None and access.mode == "auto":
        registry = registry.with_section(KNOWLEDGE_SECTION)
    return ContextSetup(
        policy=spec.context.policy(),
        registry=registry,
        window=model_window(model_id, settings) or DEFAULT_WINDOW,
        counter=model_counter(model_id, settings),
        summarizer=summarizer,
        summaries=summaries if summarizer else None,
        profile={"name": agent.name, "version": agent.version},
        model_id=model_id,
        section_options={
            "skills": {
                "library": skills if spec.skills.allowed else None,
                "allowed": list(spec.skills.allowed),
                "preload": list(spec.skills.preload),
                "autoSelect": spec.skills.auto_select.model_dump(by_alias=True),
            },
            "plan": spec.plan.model_dump(by_alias=True),
            "memory": memory_options(agent, roles),
            "retrieval": spec.retrieval,
            "knowledge": access,
        },
    )


async def profile_toolbox(
    registry: ToolRegistry,
    pool: Pool,
    run: Run,
    agent: AgentVersion,
    overlay: TenantToolConfig | None,
    held: HeldOutcomes | None = None,
) -> Toolbox:
    """Build the toolbox of one attempt: the tenant's tools, narrowed to the profile's.

    The profile's per-tool policy lies on top of the operator's and the tenant's (`overlay`,
    as its run's claim read it). `held`: on a run's first attempt, where the ledger keeps calls
    that are safe to run again until their outcome's event is stored (`HeldOutcomes`).
    """
    policies = agent.spec.tool_policies
    if policies:
        effective = registry.resolve(run.tenant_id, overlay).tools
        overlay = (overlay or TenantToolConfig()).model_copy(
            update={"tools": {**effective, **policies}}
        )
    toolbox = await registry.toolbox(
        run_id=run.id,
        tenant_id=run.tenant_id,
        user_id=run.user_id,
        roles=frozenset(run.principal_roles),
        generation=run.lease_generation,
        ledger=PostgresToolLedger(pool, run.tenant_id, held),
        overlay=overlay,
        only=tool_allow_list(agent, run.options.get("tools")),
    )
    hidden: set[str] = set()
    if agent.spec.memory.mode == "off":
        hidden |= set(MEMORY_TOOLS)
    if agent.spec.knowledge.mode == "off":
        hidden |= set(KNOWLEDGE_TOOLS)
    if not agent.spec.skills.allowed:
        hidden |= set(SKILL_TOOLS)
    if not agent.spec.plan.enabled:
        hidden |= set(PLAN_TOOLS)
    # Delegating is opt-in: only agents whose profile (or run) names the tool may delegate.
    if DELEGATE_TOOL not in (agent.spec.tools or ()) and DELEGATE_TOOL not in (
        run.options.get("tools") or ()
    ):
        hidden.add(DELEGATE_TOOL)
    return replace(toolbox, allowed=toolbox.allowed - hidden) if hidden else toolbox


def tool_allow_list(agent: AgentVersion, run_only: Sequence[str] | None) -> list[str] | None:
    """Return the tools the run may use: the profile's list, narrowed by the run's own."""
    profile = agent.spec.tools
    if profile is None:
        return None if run_only is None else list(run_only)
    if run_only is None:
        return list(profile)
    return [t for t in profile if t in set(run_only)]


def run_caller(
    models: ModelRegistry,
    model_id: str,
    agent: AgentVersion,
    *,
    budget: Budget,
    totals: dict[str, Any] | None,
) -> ResilientModelCaller:
    """Build the run's model caller: its model, then the profile's fallbacks (or the server's)."""
    caller = models.caller(model_id, budget=budget, totals=totals)
    fallbacks = agent.spec.fallbacks
    if fallbacks is None:
        return caller
    return replace(caller, choices=[caller.choices[0], *(models.choice(m) for m in fallbacks)])
