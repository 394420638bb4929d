"""Server side of the tool runtime: per-tenant config overlays and each run's toolbox."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from psycopg import AsyncCursor
from psycopg.types.json import Jsonb

from graphs.events import EventType
from server.auth import Principal
from server.db.pool import Conn, Pool
from server.errors import ToolConfigError
from server.events.store import StoredEvent, StoreHook
from server.lifecycle import audit
from tools.config import TenantToolConfig
from tools.ledger import HeldOutcomes
from tools.policy import Toolbox
from tools.registry import ToolRegistry


def held_outcomes(held: HeldOutcomes) -> StoreHook:
    """The run's event writer's hook that writes held tool calls' ledger rows.

    A call held by the attempt's ledger (`HeldOutcomes`) gets its row in the transaction that
    stores its `tool.completed` or `tool.failed` event: the outcome a client can read is one
    the ledger holds, and a replay finds it (docs/decisions/2026).
    """

    async def store(cur: AsyncCursor[Any], run_id: str, events: Sequence[StoredEvent]) -> None:
        await held.write(cur, [str(e.data.get("toolCallId")) for e in events])

    return StoreHook(frozenset({EventType.TOOL_COMPLETED, EventType.TOOL_FAILED}), store)


async def load_overlay(conn: Conn, tenant_id: str) -> TenantToolConfig | None:
    """Return the tenant admin's stored tool config, if any."""
    cur = await conn.execute(
        "SELECT config FROM tenant_tool_configs WHERE tenant_id = %s", (tenant_id,)
    )
    row = await cur.fetchone()
    return overlay_of(row["config"] if row else None)


def overlay_of(stored: dict[str, Any] | None) -> TenantToolConfig | None:
    """The tenant admin's tool config of its stored JSON (None: none stored)."""
    return TenantToolConfig.model_validate(stored) if stored is not None else None


def check_overlay(config: TenantToolConfig, allowed_hosts: list[str]) -> None:
    """Refuse API-configured MCP servers that could run commands or reach unlisted hosts.

    Raises:
        ToolConfigError: an stdio server, or an HTTP server on a host the operator did not list
            in AGENTRT_MCP_API_ALLOWED_HOSTS.
    """
    for name, server in (config.mcp_servers or {}).items():
        if server.transport == "stdio":
            raise ToolConfigError(
                f"MCP server {name!r}: stdio servers run commands on the server, so only the "
                "operator can configure them (AGENTRT_TOOL_CONFIG)"
            )
        host = (urlparse(server.url or "").hostname or "").lower()
        if "*" not in allowed_hosts and host not in {h.lower() for h in allowed_hosts}:
            raise ToolConfigError(
                f"MCP server {name!r}: host {host!r} is not in AGENTRT_MCP_API_ALLOWED_HOSTS "
                f"({', '.join(allowed_hosts) or 'empty'})"
            )


async def store_overlay(pool: Pool, who: Principal, config: TenantToolConfig) -> None:
    """Store (replace) the tenant's tool config overlay; the audit row shows what changed."""
    after = config.model_dump(mode="json", exclude_unset=True)
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "SELECT config FROM tenant_tool_configs WHERE tenant_id = %s FOR UPDATE",
            (who.tenant_id,),
        )
        row = await cur.fetchone()
        await conn.execute(
            "INSERT INTO tenant_tool_configs (tenant_id, config, updated_by) VALUES (%s, %s, %s)"
            " ON CONFLICT (tenant_id) DO UPDATE SET config = EXCLUDED.config,"
            " updated_by = EXCLUDED.updated_by, updated_at = now()",
            (
                who.tenant_id,
                Jsonb(config.model_dump(mode="json", exclude_unset=True)),
                who.user_id,
            ),
        )
        await audit.record(
            conn,
            tenant_id=who.tenant_id,
            actor=who.user_id,
            action="tool_config.changed",
            target=f"tools:{who.tenant_id}",
            diff=audit.small_diff(row["config"] if row else None, after),
        )


async def principal_toolbox(registry: ToolRegistry, pool: Pool, who: Principal) -> Toolbox:
    """Build the toolbox a run started by `who` now would get (for listings and edits)."""
    async with pool.connection() as conn:
        overlay = await load_overlay(conn, who.tenant_id)
    return await registry.toolbox(
        run_id="-", tenant_id=who.tenant_id, user_id=who.user_id, roles=who.roles, overlay=overlay
    )
