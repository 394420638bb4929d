"""Operator endpoints (role `admin`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

from server.auth import CurrentPrincipal, Principal
from server.schemas import COMMON_ERRORS, QueueView, errors

router = APIRouter(prefix="/api/admin", tags=["admin"], responses=COMMON_ERRORS)


def require_admin(who: Principal) -> None:
    """Refuse callers without the admin role."""
    if not who.has_role("admin"):
        raise HTTPException(403, "this endpoint needs the admin role")


@router.get("/queue", response_model=QueueView, responses=errors(403))
async def queue(request: Request, who: Principal = CurrentPrincipal) -> dict[str, Any]:
    """Say how the queue and the workers are doing, across all tenants."""
    require_admin(who)
    async with request.app.state.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status, count(*) AS n FROM runs"
            " WHERE status NOT IN ('completed', 'failed', 'cancelled') GROUP BY status"
        )
        counts = {r["status"]: r["n"] for r in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float AS age"
            " FROM runs WHERE status = 'queued'"
        )
        oldest = await cur.fetchone()
        cur = await conn.execute(
            "SELECT id, host, pid, concurrency, active_runs, draining, started_at,"
            " last_heartbeat_at, EXTRACT(EPOCH FROM now() - last_heartbeat_at)::float AS age"
            " FROM workers ORDER BY started_at"
        )
        workers = await cur.fetchall()
        cur = await conn.execute(
            "SELECT id, tenant_id, status, lease_owner, lease_expires_at, attempt, recoveries"
            " FROM runs WHERE status IN ('running', 'waiting_tool') AND lease_expires_at < now()"
            " ORDER BY lease_expires_at LIMIT 100"
        )
        expired = await cur.fetchall()
    return {
        "counts": {
            s: counts.get(s, 0)
            for s in ("queued", "running", "waiting_tool", "waiting_user", "paused")
        },
        "oldestQueuedAgeSeconds": oldest["age"] if oldest else None,
        "workers": [
            {
                "workerId": w["id"],
                "host": w["host"],
                "pid": w["pid"],
                "concurrency": w["concurrency"],
                "activeRuns": w["active_runs"],
                "draining": w["draining"],
                "startedAt": w["started_at"].isoformat(),
                "lastHeartbeatAt": w["last_heartbeat_at"].isoformat(),
                "heartbeatAgeSeconds": w["age"],
            }
            for w in workers
        ],
        "expiredLeases": [
            {
                "runId": r["id"],
                "tenantId": r["tenant_id"],
                "status": r["status"],
                "leaseOwner": r["lease_owner"],
                "leaseExpiredAt": r["lease_expires_at"].isoformat(),
                "attempt": r["attempt"],
                "recoveries": r["recoveries"],
            }
            for r in expired
        ],
    }
