"""The graph `langgraph dev` serves (langgraph.json): the server's agent, not a demo.

Runs started by LangGraph tooling carry no run context, so each gets one built like the
server's from the same settings (`AGENTRT_*`, `.env`) and profiles: the model and its
fallbacks, the tenant's tools and approval policy, the context engine. The profile is
`AGENTRT_DEV_AGENT` among the profiles declared in `AGENTRT_AGENTS_DIR` (those in version
control), or the built-in default. There is no Postgres here: the tool ledger and the
summaries are kept in memory, and LangGraph's server supplies the checkpointer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import Any

from langgraph.config import get_config

from graphs.agent import build_agent_graph
from graphs.context import RunContext
from nodes.context.summary import InMemorySummaryStore
from server.agents.files import read_agent_files
from server.agents.profiles import DEFAULT_AGENT
from server.agents.runtime import context_setup, run_caller, tool_allow_list
from server.agents.store import BUILTIN, AgentVersion
from server.app import build_tool_registry, default_tools
from server.settings import Settings
from server.usage.budgets import run_budget
from server.usage.registry import ModelRegistry

_KEEP = 64  # run contexts kept, so the nodes of one run share theirs


class DevContexts:
    """Build (and keep, per LangGraph run) the context of runs started without one."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.models = ModelRegistry(settings)
        self.tools = build_tool_registry(settings, default_tools(settings))
        self.summaries = InMemorySummaryStore()
        self.agent = self._agent(settings.dev_agent)
        self.model_id = self.models.validate(self.agent.spec.model or settings.default_model)
        self._runs: OrderedDict[str, RunContext] = OrderedDict()

    def _agent(self, name: str) -> AgentVersion:
        for declared in read_agent_files(self.settings.agents_dir, self.settings.default_tenant):
            if declared.name == name:
                return AgentVersion(name, 1, declared.spec, "file", declared.path)
        if name != DEFAULT_AGENT:
            raise ValueError(
                f"AGENTRT_DEV_AGENT={name!r} is not declared in {self.settings.agents_dir}"
            )
        return BUILTIN

    async def __call__(self, given: RunContext | None) -> RunContext:
        """Return the context of the current LangGraph run (built on its first node)."""
        config = get_config()
        key = (config.get("metadata") or {}).get("run_id") or (
            config.get("configurable") or {}
        ).get("thread_id")
        if key is None:  # nothing to share it by: each node builds its own
            return await self._build(given or RunContext(), "local")
        found = self._runs.get(str(key))
        if found is None:
            found = await self._build(given or RunContext(), str(key))
            self._runs[str(key)] = found
            while len(self._runs) > _KEEP:
                self._runs.popitem(last=False)
        return found

    async def _build(self, given: RunContext, run_id: str) -> RunContext:
        s, agent = self.settings, self.agent
        tenant = given.tenant_id if given.tenant_id != "default" else s.default_tenant
        budget = run_budget({}, s)
        caller = run_caller(self.models, self.model_id, agent, budget=budget, totals=None)
        toolbox = await self.tools.toolbox(
            run_id=run_id,
            tenant_id=tenant,
            user_id=given.user_id,
            roles=frozenset({"admin"}),
            only=tool_allow_list(agent, None),
        )
        setup = context_setup(
            agent,
            self.model_id,
            models=self.models,
            settings=s,
            summaries=self.summaries,
            caller=caller,
        )
        return replace(
            given,
            run_id=run_id,
            tenant_id=tenant,
            model_caller=caller,
            tools=toolbox.visible(),
            toolbox=toolbox,
            max_steps=agent.spec.max_steps or s.max_steps,
            tool_timeout_s=s.tool_timeout_s,
            system_prompt=agent.spec.instructions,
            context_setup=setup,
            prepared={},
        )


def build_dev_graph(settings: Settings | None = None) -> Any:
    """Compile the agent graph with run contexts from `settings` (read from the environment)."""
    return build_agent_graph(DevContexts(settings or Settings())).compile()


graph = build_dev_graph()
