"""The process's tool catalogue, resolved per tenant and per run into a `Toolbox`."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from langchain_core.tools import BaseTool

from tools.config import ResolvedConfig, TenantToolConfig, ToolConfig
from tools.ledger import InMemoryToolLedger, ToolLedger
from tools.mcp import McpCatalog
from tools.policy import Toolbox, apply_override
from tools.spec import ToolSpec, from_langchain, spec_mapping

log = logging.getLogger(__name__)


class ToolRegistry:
    """Python tools shared by every tenant, plus each tenant's MCP tools and policy.

    Args:
        tools: The Python tools (ToolSpecs, or langchain tools taken as low risk).
        config: The operator's tool configuration.
        mcp: The MCP discovery cache.
        default_timeout_s: Timeout of tools that declare none.
        max_output_chars: Budget of a result the model sees, for tools that declare none.
    """

    def __init__(
        self,
        tools: Sequence[ToolSpec | BaseTool],
        config: ToolConfig | None = None,
        mcp: McpCatalog | None = None,
        *,
        default_timeout_s: float = 30.0,
        max_output_chars: int = 16_000,
    ) -> None:
        self.base = spec_mapping(
            [t if isinstance(t, ToolSpec) else from_langchain(t) for t in tools]
        )
        self.config = config or ToolConfig()
        self.mcp = mcp or McpCatalog()
        self.default_timeout_s = default_timeout_s
        self.max_output_chars = max_output_chars

    def resolve(self, tenant_id: str, overlay: TenantToolConfig | None = None) -> ResolvedConfig:
        """Return the tenant's effective tool config."""
        return self.config.for_tenant(tenant_id, overlay)

    async def catalogue(self, config: ResolvedConfig) -> tuple[dict[str, ToolSpec], dict[str, str]]:
        """Return the tenant's tools (overrides applied) and its unavailable providers."""
        specs = dict(self.base)
        mcp_specs, unavailable = await self.mcp.tools_for(config.mcp_servers)
        for spec in mcp_specs:
            if spec.name in specs:
                log.warning("MCP tool %s (%s) ignored: the name is taken", spec.name, spec.source)
                continue
            specs[spec.name] = spec
        return {n: apply_override(s, config.tools.get(n)) for n, s in specs.items()}, unavailable

    async def toolbox(
        self,
        *,
        run_id: str,
        tenant_id: str,
        user_id: str,
        roles: frozenset[str] = frozenset(),
        generation: int = 1,
        ledger: ToolLedger | None = None,
        overlay: TenantToolConfig | None = None,
        only: Sequence[str] | None = None,
    ) -> Toolbox:
        """Build the toolbox of one run attempt.

        Args:
            run_id: The run.
            tenant_id: Its tenant.
            user_id: Who started it.
            roles: That user's roles (permissions come from the tenant's grants).
            generation: The run's lease generation (fences the ledger).
            ledger: The tool ledger (in memory when None).
            overlay: The tenant admin's config stored through the API.
            only: The run's own allow-list of tool names, if it has one.
        """
        config = self.resolve(tenant_id, overlay)
        specs, unavailable = await self.catalogue(config)
        allowed = {n for n in specs if config.allows(n)}
        if only is not None:
            allowed &= set(only)
        return Toolbox(
            run_id=run_id,
            tenant_id=tenant_id,
            user_id=user_id,
            specs=specs,
            allowed=frozenset(allowed),
            permissions=config.permissions_for(roles),
            config=config,
            ledger=ledger or InMemoryToolLedger(),
            unavailable=unavailable,
            generation=generation,
            default_timeout_s=self.default_timeout_s,
            max_output_chars=self.max_output_chars,
        )
