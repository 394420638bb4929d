"""The queue as operators see it: runs waiting, workers and their load, expired leases."""

from __future__ import annotations

from typing import Any

from server.db.pool import Conn, Pool
from server.domain import IN_PROGRESS, RunStatus, in_phase, status_in


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
        f"   AND {in_phase('active')} AND lease_owner IS NOT NULL GROUP BY lease_owner) r"
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


async def queue_view(pool: Pool, tenant: str | None) -> dict[str, Any]:
    """Say how the queue and the workers are doing, for one tenant or (None) the installation.

    The installation's view names every worker with its host and pid; a tenant's view shows
    only the workers running the tenant's runs, without their hosts.
    """
    # `%(tenant)s IS NULL` keeps one query for both views; NULL means every tenant.
    scope = "(%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)"
    params = {"tenant": tenant}
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status, count(*) AS n FROM runs"
            f" WHERE {status_in(IN_PROGRESS)} AND {scope}"
            " GROUP BY status",
            params,
        )
        counts = {r["status"]: r["n"] for r in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float AS age"
            f" FROM runs WHERE {in_phase('queued')} AND {scope}",
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
            f" FROM runs WHERE {in_phase('active')} AND lease_owner IS NOT NULL"
            " AND lease_expires_at < now()"
            f" AND {scope} ORDER BY lease_expires_at LIMIT 100",
            params,
        )
        expired = await cur.fetchall()
    return {
        "scope": "installation" if tenant is None else "tenant",
        "tenantId": tenant,
        "counts": {s.value: counts.get(s, 0) for s in RunStatus if s in IN_PROGRESS},
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
