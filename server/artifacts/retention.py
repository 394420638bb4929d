"""Artifact retention: versions older than their tenant's retention are deleted.

The bytes are deleted first and the record after, so a failure in between leaves a record
that the next prune deletes again (deleting a missing object is not an error), never an
object nobody can find. An artifact whose every version is gone goes with them. Versions
left `writing` by a crash for more than a day are removed the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from server.artifacts.storage import Storage
from server.db.pool import Pool
from server.settings import Settings

log = logging.getLogger(__name__)

STALE_WRITES_DAYS = 1.0
_PRUNE_LOCK = 7_262_616_015
_OLD = """
SELECT artifact_id, version, object_key FROM artifact_versions
WHERE tenant_id = %(tenant)s AND created_at < now() - make_interval(secs => %(keep)s)
ORDER BY created_at LIMIT %(batch)s
"""
_STALE = """
SELECT artifact_id, version, object_key FROM artifact_versions
WHERE status = 'writing' AND created_at < now() - make_interval(secs => %(keep)s)
ORDER BY created_at LIMIT %(batch)s
"""
_LATEST = """
UPDATE artifacts a SET latest_version = coalesce(
    (SELECT max(version) FROM artifact_versions v
     WHERE v.artifact_id = a.id AND v.status = 'ready'), 0)
WHERE a.id = ANY(%s)
"""


async def _delete(pool: Pool, storage: Storage, query: str, params: Mapping[str, object]) -> int:
    """Delete the versions `query` selects, batch by batch; return how many."""
    total = 0
    while True:
        async with pool.connection() as conn:
            cur = await conn.execute(query, params)
            rows = await cur.fetchall()
        if not rows:
            return total
        for row in rows:
            await storage.delete(row["object_key"])
        artifacts = sorted({r["artifact_id"] for r in rows})
        async with pool.connection() as conn, conn.transaction():
            await conn.execute(
                "DELETE FROM artifact_versions WHERE (artifact_id, version) IN"
                " (SELECT * FROM unnest(%s::text[], %s::int[]))",
                ([r["artifact_id"] for r in rows], [r["version"] for r in rows]),
            )
            await conn.execute(_LATEST, (artifacts,))
            await conn.execute(
                "DELETE FROM artifacts a WHERE a.id = ANY(%s) AND NOT EXISTS"
                " (SELECT 1 FROM artifact_versions v WHERE v.artifact_id = a.id)",
                (artifacts,),
            )
        total += len(rows)


async def _delete_erased(pool: Pool, storage: Storage, batch: int) -> int:
    """Delete the objects of versions an erasure removed, then their queue rows."""
    total = 0
    while True:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT object_key FROM artifact_objects_erased ORDER BY erased_at LIMIT %s",
                (batch,),
            )
            keys = [r["object_key"] for r in await cur.fetchall()]
        if not keys:
            return total
        for key in keys:
            await storage.delete(key)
        async with pool.connection() as conn:
            await conn.execute(
                "DELETE FROM artifact_objects_erased WHERE object_key = ANY(%s)", (keys,)
            )
        total += len(keys)


async def prune_artifacts(
    pool: Pool, storage: Storage, settings: Settings, batch: int = 500
) -> int:
    """Delete artifact versions past their tenant's retention; return how many went.

    Runs in one process at a time (advisory lock); another process's call returns 0.
    """
    async with pool.connection() as lock:
        cur = await lock.execute("SELECT pg_try_advisory_lock(%s) AS ok", (_PRUNE_LOCK,))
        row = await cur.fetchone()
        if not row or not row["ok"]:
            return 0
        try:
            return await _prune(pool, storage, settings, batch)
        finally:
            await lock.execute("SELECT pg_advisory_unlock(%s)", (_PRUNE_LOCK,))


async def _prune(pool: Pool, storage: Storage, settings: Settings, batch: int) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT DISTINCT tenant_id FROM artifact_versions")
        tenants = [r["tenant_id"] for r in await cur.fetchall()]
    total = 0
    for tenant in tenants:
        days = settings.artifact_retention_for(tenant)
        if days is not None:
            params = {"tenant": tenant, "keep": days * 86_400, "batch": batch}
            total += await _delete(pool, storage, _OLD, params)
    stale = {"keep": STALE_WRITES_DAYS * 86_400, "batch": batch}
    total += await _delete(pool, storage, _STALE, stale)
    total += await _delete_erased(pool, storage, batch)
    if total:
        log.info("pruned %d artifact versions past their retention", total)
    return total
