"""Queue and worker views: the whole installation for an operator, one tenant for its admin."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

from server.auth import CurrentPrincipal, Principal
from server.db.pool import Conn
from server.routes.schemas import COMMON_ERRORS, QueueView, errors

router = APIRouter(prefix="/api/admin", tags=["admin"], responses=COMMON_ERRORS)

ACTIVE = ("queued", "running", "waiting_tool", "waiting_user", "paused")


def require_admin(who: Principal) -> None:
    """Refuse callers who are neither an operator nor their tenant's admin."""
    if not (who.is_operator or who.has_role("admin")):
        raise HTTPException(
            403,
            "this endpoint needs the operator role (whole installation) or the admin role "
            "(your tenant)",
        )


def worker_label(owner: str | None) -> str | None:
    """Return a worker's id without its host and pid (`host:pid:id` -> `id`)."""
    return owner.rsplit(":", 1)[-1] if owner else None


async def _installation_workers(conn: Conn) -> list[dict[str, Any]]:
    cur = await conn.execute(
        "SELECT id, host, pid, concurrency, active_runs, draining, started_at,"
        " last_heartbeat_at, EXTRACT(EPOCH FROM now() - last_heartbeat_at)::float AS age"
        " FROM workers ORDER BY started_at"
    )
    return [
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
        for w in await cur.fetchall()
    ]


async def _tenant_workers(conn: Conn, tenant_id: str) -> list[dict[str, Any]]:
    """Workers holding the tenant's runs, without hosts, pids or other tenants' load."""
    cur = await conn.execute(
        "SELECT w.id, w.draining, w.started_at, w.last_heartbeat_at,"
        " EXTRACT(EPOCH FROM now() - w.last_heartbeat_at)::float AS age, r.n"
        " FROM (SELECT lease_owner, count(*) AS n FROM runs WHERE tenant_id = %s"
        "   AND status IN ('running', 'waiting_tool') GROUP BY lease_owner) r"
        " JOIN workers w ON w.id = r.lease_owner ORDER BY w.started_at",
        (tenant_id,),
    )
    return [
        {
            "workerId": worker_label(w["id"]),
            "host": None,
            "pid": None,
            "concurrency": None,
            "activeRuns": w["n"],
            "draining": w["draining"],
            "startedAt": w["started_at"].isoformat(),
            "lastHeartbeatAt": w["last_heartbeat_at"].isoformat(),
            "heartbeatAgeSeconds": w["age"],
        }
        for w in await cur.fetchall()
    ]


@router.get("/queue", response_model=QueueView, responses=errors(403))
async def queue(request: Request, who: Principal = CurrentPrincipal) -> dict[str, Any]:
    """Say how the queue and the workers are doing.

    An operator sees every tenant and every worker; a tenant admin sees its own tenant's runs
    and the workers running them, without their hosts.
    """
    require_admin(who)
    tenant = None if who.is_operator else who.tenant_id
    # `%(tenant)s IS NULL` keeps one query for both views; NULL means every tenant.
    scope = "(%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)"
    params = {"tenant": tenant}
    async with request.app.state.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status, count(*) AS n FROM runs"
            f" WHERE status NOT IN ('completed', 'failed', 'cancelled') AND {scope}"
            " GROUP BY status",
            params,
        )
        counts = {r["status"]: r["n"] for r in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float AS age"
            f" FROM runs WHERE status = 'queued' AND {scope}",
            params,
        )
        oldest = await cur.fetchone()
        workers = (
            await _installation_workers(conn)
            if tenant is None
            else await _tenant_workers(conn, tenant)
        )
        cur = await conn.execute(
            "SELECT id, tenant_id, status, lease_owner, lease_expires_at, attempt, recoveries"
            " FROM runs WHERE status IN ('running', 'waiting_tool') AND lease_expires_at < now()"
            f" AND {scope} ORDER BY lease_expires_at LIMIT 100",
            params,
        )
        expired = await cur.fetchall()
    return {
        "scope": "installation" if tenant is None else "tenant",
        "tenantId": tenant,
        "counts": {s: counts.get(s, 0) for s in ACTIVE},
        "oldestQueuedAgeSeconds": oldest["age"] if oldest else None,
        "workers": workers,
        "expiredLeases": [
            {
                "runId": r["id"],
                "tenantId": r["tenant_id"],
                "status": r["status"],
                "leaseOwner": r["lease_owner"]
                if tenant is None
                else worker_label(r["lease_owner"]),
                "leaseExpiredAt": r["lease_expires_at"].isoformat(),
                "attempt": r["attempt"],
                "recoveries": r["recoveries"],
            }
            for r in expired
        ],
    }
