"""Tools: what the caller's runs can use, and the tenant's tool configuration."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter

from server.auth import Principal
from server.deps import PoolDep, PrincipalDep, SettingsDep, ToolsDep
from server.errors import ForbiddenError
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, ToolConfigView, ToolList, errors
from server.runs.toolbox import check_overlay, load_overlay, principal_toolbox, store_overlay
from tools.config import TenantToolConfig
from tools.policy import approval_reason

router = APIRouter(prefix="/api/tools", tags=["tools"], responses=COMMON_ERRORS)


def _require_admin(who: Principal) -> None:
    if not who.has_role("admin"):
        raise ForbiddenError("the tenant's tool configuration needs the admin role")


def _hide_secrets(config: dict[str, Any]) -> dict[str, Any]:
    for server in (config.get("mcp_servers") or {}).values():
        for key in ("headers", "env"):
            if server.get(key):
                server[key] = dict.fromkeys(server[key], "[redacted]")
    return config


@router.get("", response_model=ToolList)
async def get_tools(tools_: ToolsDep, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """List the tenant's tools: policy, whether the caller's runs may call them, schemas."""
    toolbox = await principal_toolbox(tools_, pool, who)
    tools = []
    for name, spec in sorted(toolbox.specs.items()):
        tools.append(
            {
                "name": name,
                "description": spec.description,
                "source": spec.source,
                "risk": spec.risk,
                "permissions": sorted(spec.permissions),
                "idempotent": spec.idempotent,
                "dedupes": spec.dedupes,
                "timeoutS": spec.timeout_s or toolbox.default_timeout_s,
                "approvalRequired": approval_reason(toolbox, spec) is not None,
                "allowed": name in toolbox.allowed,
                "permitted": toolbox.permitted(spec),
                "inputSchema": spec.input_schema(),
            }
        )
    unavailable = [
        {"source": source, "reason": reason}
        for source, reason in sorted(toolbox.unavailable.items())
        if source.startswith("mcp:")
    ]
    return {"tools": tools, "unavailable": unavailable}


@router.get("/config", response_model=ToolConfigView, responses=errors(403))
async def get_tool_config(tools: ToolsDep, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """Return the tenant's stored overlay and the effective config (secrets hidden)."""
    _require_admin(who)
    async with pool.connection() as conn:
        overlay = await load_overlay(conn, who.tenant_id)
    effective = tools.resolve(who.tenant_id, overlay).raw
    return {
        "overlay": _hide_secrets(overlay.model_dump(mode="json", exclude_unset=True))
        if overlay
        else None,
        "effective": _hide_secrets(effective.model_dump(mode="json")),
    }


@router.put("/config", response_model=ToolConfigView, responses={**BODY_ERRORS, **errors(403)})
async def put_tool_config(
    body: Annotated[TenantToolConfig, CleanText],
    settings: SettingsDep,
    tools: ToolsDep,
    pool: PoolDep,
    who: PrincipalDep,
) -> dict[str, Any]:
    """Replace the tenant's overlay on the operator's tool config (tenant admins only)."""
    _require_admin(who)
    check_overlay(body, settings.mcp_api_allowed_hosts)
    await store_overlay(pool, who, body)
    return await get_tool_config(tools, pool, who)
