"""Data lifecycle: the audit log, retention settings, erasure and export."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from server.auth import require_admin
from server.deps import PoolDep, PrincipalDep, SettingsDep
from server.errors import ForbiddenError
from server.lifecycle.audit import AuditFilter, audit_view, list_audit
from server.lifecycle.erasure import erase_conversation, erase_user
from server.lifecycle.export import export_lines, open_export
from server.lifecycle.policy import get_retention, set_retention
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, errors
from server.timestamps import IsoTime
from tools.jsontypes import NotTextOrFlag

router = APIRouter(tags=["lifecycle"], responses=COMMON_ERRORS)

_CANCEL = Query(
    False, description="Cancel the runs in progress first (and wait a little for them to end)."
)


Days = Annotated[int, Field(ge=1, le=36500), NotTextOrFlag]
"""A retention period in days, up to a hundred years."""


class RetentionIn(BaseModel):
    """Body of `PUT /api/retention`: a tenant's overrides, in days; null means the default."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    events_days: Days | None = Field(default=None, alias="eventsDays")
    spans_days: Days | None = Field(default=None, alias="spansDays")
    ledger_days: Days | None = Field(default=None, alias="ledgerDays")
    audit_days: Days | None = Field(default=None, alias="auditDays")


@router.get("/api/audit", responses=errors(403))
async def get_audit(
    pool: PoolDep,
    who: PrincipalDep,
    tenant: str | None = Query(None, description="Operators only: one tenant's rows."),
    actor: str | None = Query(None, max_length=200),
    action: str | None = Query(None, max_length=100, description="e.g. key.revoked, or key"),
    target: str | None = Query(None, max_length=300),
    since: Annotated[IsoTime | None, Query(description="ISO 8601, inclusive.")] = None,
    until: Annotated[IsoTime | None, Query(description="ISO 8601, exclusive.")] = None,
    limit: int = Query(100, ge=1, le=1000),
    cursor: str | None = Query(None, pattern=r"^[0-9]{1,18}$", description="`nextCursor`."),
) -> dict[str, Any]:
    """List audit rows newest first: admins see their tenant's, operators every tenant's."""
    require_admin(who)
    if tenant is not None and not who.is_operator and tenant != who.tenant_id:
        raise ForbiddenError("only an operator may read another tenant's audit log")
    scope = tenant if who.is_operator else who.tenant_id
    where = AuditFilter(scope, actor, action, target, since, until)
    rows, next_id = await list_audit(
        pool, where, before=int(cursor) if cursor else None, limit=limit
    )
    return {
        "entries": [audit_view(r) for r in rows],
        "nextCursor": str(next_id) if next_id is not None else None,
    }


@router.get("/api/retention", responses=errors(403))
async def get_retention_route(
    pool: PoolDep, settings: SettingsDep, who: PrincipalDep
) -> dict[str, Any]:
    """Return the tenant's retention: effective values, its overrides, the defaults."""
    require_admin(who)
    return await get_retention(pool, settings, who.tenant_id)


@router.put("/api/retention", responses={**BODY_ERRORS, **errors(403)})
async def put_retention(
    body: RetentionIn, pool: PoolDep, settings: SettingsDep, who: PrincipalDep
) -> dict[str, Any]:
    """Replace the tenant's retention overrides (tenant admins); audited."""
    if not who.has_role("admin"):
        raise ForbiddenError("changing the tenant's retention needs the admin role")
    return await set_retention(pool, settings, who, body.model_dump())


@router.delete("/api/conversations/{conversation_id}", responses=errors(403, 404, 409))
async def delete_conversation(
    conversation_id: str,
    pool: PoolDep,
    settings: SettingsDep,
    who: PrincipalDep,
    cancel: bool = _CANCEL,
) -> dict[str, Any]:
    """Erase the conversation: runs, events, checkpoints, messages, spans, memories from it.

    Idempotent: erasing it again answers with the same erasure.
    """
    erased = await erase_conversation(
        pool, who, conversation_id, cancel=cancel, wait_s=settings.erasure_cancel_wait_s
    )
    return erased.view()


@router.delete("/api/users/{user_id}/data", responses=errors(403, 409))
async def delete_user_data(
    user_id: str,
    pool: PoolDep,
    settings: SettingsDep,
    who: PrincipalDep,
    cancel: bool = _CANCEL,
) -> dict[str, Any]:
    """Erase everything of the user in the caller's tenant and revoke their keys (admins)."""
    erased = await erase_user(
        pool, who, user_id, cancel=cancel, wait_s=settings.erasure_cancel_wait_s
    )
    return erased.view()


@router.get(
    "/api/conversations/{conversation_id}/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "JSON lines, each with a `kind`: conversation, message, run, "
            "event (the wire event), usage.",
            "content": {"application/x-ndjson": {}},
        },
        **errors(404),
    },
)
async def export_conversation(
    conversation_id: str, pool: PoolDep, who: PrincipalDep
) -> StreamingResponse:
    """Export the conversation as JSON lines, streamed."""
    conversation = await open_export(pool, who, conversation_id)
    return StreamingResponse(
        export_lines(pool, who, conversation),
        media_type="application/x-ndjson",
        headers={
            "Content-Disposition": f'attachment; filename="{conversation_id}.jsonl"',
            "Cache-Control": "no-store",
        },
    )
