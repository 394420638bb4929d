"""Operator views: the queue and the workers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from server.auth import require_admin
from server.deps import PoolDep, PrincipalDep
from server.routes.schemas import COMMON_ERRORS, QueueView, errors
from server.runs.queue import queue_view

router = APIRouter(prefix="/api/admin", tags=["admin"], responses=COMMON_ERRORS)


@router.get("/queue", response_model=QueueView, responses=errors(403))
async def queue(pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """Say how the queue and the workers are doing.

    An operator sees every tenant and every worker; a tenant admin sees its own tenant's runs
    and the workers running them, without their hosts.
    """
    require_admin(who)
    return await queue_view(pool, None if who.is_operator else who.tenant_id)
