"""Per-tenant tool configuration: which tools, what risk, who may call them, which MCP servers.

The operator sets it in `AGENTRT_TOOL_CONFIG` (JSON); a tenant admin can overlay their own
tenant's part through `PUT /api/tools/config`. See docs/tools.md for the fields.
"""

from __future__ import annotations

import fnmatch
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tools.jsontypes import JsonBool, JsonFloat, NotTextOrFlag

# Defined here, not in tools.spec, so that settings load without importing langchain.
Risk = Literal["low", "medium", "high"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ToolOverride(_Model):
    """Policy for one tool, overriding what the tool declares."""

    risk: Risk | None = None
    approval: Literal["risk", "always", "never"] = "risk"
    permissions: list[str] | None = None
    timeout_s: JsonFloat | None = Field(default=None, gt=0)
    max_attempts: Annotated[int, Field(ge=1, le=10), NotTextOrFlag] | None = None
    idempotent: JsonBool | None = None
    dedupes: JsonBool | None = None
    redact: list[str] | None = None
    max_output_chars: Annotated[int, Field(ge=100), NotTextOrFlag] | None = None
    approval_timeout_s: JsonFloat | None = Field(default=None, gt=0)


class McpServerConfig(_Model):
    """One MCP server: how to reach it and the policy for its tools (default risk medium)."""

    transport: Literal["stdio", "streamable_http"]
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    prefix: JsonBool = False
    risk: Risk = "medium"
    permissions: list[str] = Field(default_factory=list)
    timeout_s: JsonFloat = Field(default=30.0, gt=0)
    discovery_timeout_s: JsonFloat = Field(default=15.0, gt=0)
    tools: dict[str, ToolOverride] = Field(default_factory=dict)

    def connection(self) -> dict[str, Any]:
        """Return the langchain-mcp-adapters connection dict."""
        if self.transport == "stdio":
            if not self.command:
                raise ValueError("an stdio MCP server needs 'command'")
            conn: dict[str, Any] = {"transport": "stdio", "command": self.command}
            conn["args"] = list(self.args)
            if self.env is not None:
                conn["env"] = dict(self.env)
            if self.cwd is not None:
                conn["cwd"] = self.cwd
            return conn
        if not self.url:
            raise ValueError("a streamable_http MCP server needs 'url'")
        conn = {"transport": "streamable_http", "url": self.url, "timeout": self.timeout_s}
        if self.headers:
            conn["headers"] = dict(self.headers)
        return conn


class TenantToolConfig(_Model):
    """One tenant's tool policy. Unset fields take the operator's defaults.

    Attributes:
        allow: Glob patterns of tool names the tenant may use (`*` for all).
        deny: Glob patterns removed from `allow`.
        approval_risks: Risk levels that pause for human approval.
        grants: Role -> permissions; role `*` applies to everyone in the tenant and the
            permission `*` grants all.
        redact: Argument names redacted in events for every tool.
        tools: Per-tool overrides.
        mcp_servers: MCP servers whose tools this tenant gets.
        max_parallel_tools: How many calls of one model turn run at once.
        approval_timeout_s: Pending approvals expire (as rejected) after this; None = never.
    """

    allow: list[str] | None = None
    deny: list[str] | None = None
    approval_risks: list[Risk] | None = None
    grants: dict[str, list[str]] | None = None
    redact: list[str] | None = None
    tools: dict[str, ToolOverride] | None = None
    mcp_servers: dict[str, McpServerConfig] | None = None
    max_parallel_tools: Annotated[int, Field(ge=1, le=64), NotTextOrFlag] | None = None
    approval_timeout_s: JsonFloat | None = Field(default=None, gt=0)

    def overlay(self, other: TenantToolConfig | None) -> TenantToolConfig:
        """Return this config with every field that `other` sets replaced by `other`'s."""
        if other is None:
            return self
        merged = {
            **self.model_dump(exclude_none=True),
            **other.model_dump(exclude_unset=True, exclude_none=True),
        }
        return TenantToolConfig.model_validate(merged)


DEFAULTS = TenantToolConfig(
    allow=["*"],
    deny=[],
    approval_risks=["high"],
    grants={"admin": ["*"]},
    redact=["password", "secret", "token", "api_key", "authorization"],
    tools={},
    mcp_servers={},
    max_parallel_tools=8,
    approval_timeout_s=None,
)


class ToolConfig(_Model):
    """The operator's configuration: defaults for every tenant, and per-tenant settings."""

    default: TenantToolConfig = Field(default_factory=TenantToolConfig)
    tenants: dict[str, TenantToolConfig] = Field(default_factory=dict)

    def for_tenant(self, tenant_id: str, overlay: TenantToolConfig | None = None) -> ResolvedConfig:
        """Resolve the effective config: built-in defaults, operator defaults, tenant, overlay.

        The overlay (set by a tenant admin through the API) can only narrow the operator's
        allow/deny lists (a tool must pass both) and only add MCP servers; its other fields
        replace the operator's.
        """
        operator = DEFAULTS.overlay(self.default).overlay(self.tenants.get(tenant_id))
        layers = [(list(operator.allow or []), list(operator.deny or []))]
        merged = operator
        if overlay is not None:
            if overlay.allow is not None or overlay.deny is not None:
                layers.append((list(overlay.allow or ["*"]), list(overlay.deny or [])))
            servers = {**(overlay.mcp_servers or {}), **(operator.mcp_servers or {})}
            merged = operator.overlay(overlay.model_copy(update={"mcp_servers": servers}))
        return ResolvedConfig(merged, layers)


class ResolvedConfig:
    """A tenant's effective tool config with every field set."""

    def __init__(
        self, config: TenantToolConfig, layers: list[tuple[list[str], list[str]]] | None = None
    ) -> None:
        self.raw = config
        self.layers = layers or [(list(config.allow or []), list(config.deny or []))]
        self.approval_risks: frozenset[str] = frozenset(config.approval_risks or [])
        self.grants = dict(config.grants or {})
        self.redact = frozenset(k.lower() for k in config.redact or [])
        self.tools = dict(config.tools or {})
        self.mcp_servers = dict(config.mcp_servers or {})
        self.max_parallel_tools = config.max_parallel_tools or 8
        self.approval_timeout_s = config.approval_timeout_s

    def allows(self, name: str) -> bool:
        """Say whether every layer of allow/deny patterns admits the tool `name`."""
        return all(
            any(fnmatch.fnmatchcase(name, p) for p in allow)
            and not any(fnmatch.fnmatchcase(name, p) for p in deny)
            for allow, deny in self.layers
        )

    def permissions_for(self, roles: frozenset[str] | set[str]) -> frozenset[str]:
        """Return the permissions a caller with `roles` holds in this tenant."""
        held: set[str] = set(self.grants.get("*", []))
        for role in roles:
            held.update(self.grants.get(role, []))
        return frozenset(held)
