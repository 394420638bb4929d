"""Which skill versions runs loaded: rows written from `skill.loaded` events, and the report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncCursor

from graphs.events import EventType
from server.db.pool import Conn
from server.events.log import StoredEvent, StoreHook

_INSERT = """
INSERT INTO skill_loads (run_id, name, tenant_id, owner, version, content_hash, via,
    event_seq, loaded_at)
SELECT r.id, %(name)s, r.tenant_id, %(owner)s, %(version)s, %(hash)s, %(via)s, %(seq)s, %(ts)s
FROM runs r WHERE r.id = %(runId)s
ON CONFLICT (run_id, name) DO NOTHING
"""


async def store_skill_loads(
    cur: AsyncCursor[Any], run_id: str, events: Sequence[StoredEvent]
) -> None:
    """Insert a row for every `skill.loaded` event among `events` (the first load per run)."""
    rows = [
        {
            "name": e.data["name"],
            "owner": e.data.get("owner", "repository"),
            "version": e.data["version"],
            "hash": e.data["hash"],
            "via": e.data.get("via", "tool"),
            "seq": e.seq,
            "ts": e.ts,
            "runId": run_id,
        }
        for e in events
        if e.type == EventType.SKILL_LOADED
    ]
    if rows:
        await cur.executemany(_INSERT, rows)


# Hand to the appender of a run's events: the skill-load rows of its `skill.loaded` events.
SKILL_LOADS = StoreHook(frozenset({EventType.SKILL_LOADED}), store_skill_loads)


async def skill_usage(conn: Conn, tenant_id: str, name: str) -> list[dict[str, Any]]:
    """Return, per version of `name`, how many runs loaded it and when first and last."""
    cur = await conn.execute(
        "SELECT owner, version, content_hash, count(*) AS runs,"
        " count(*) FILTER (WHERE via = 'preload') AS preloaded,"
        " min(loaded_at) AS first_loaded_at, max(loaded_at) AS last_loaded_at"
        " FROM skill_loads WHERE tenant_id = %s AND name = %s"
        " GROUP BY owner, version, content_hash ORDER BY max(loaded_at) DESC",
        (tenant_id, name),
    )
    return [
        {
            "owner": r["owner"],
            "version": r["version"],
            "hash": r["content_hash"],
            "runs": r["runs"],
            "preloaded": r["preloaded"],
            "firstLoadedAt": r["first_loaded_at"].isoformat(),
            "lastLoadedAt": r["last_loaded_at"].isoformat(),
        }
        for r in await cur.fetchall()
    ]


async def skill_runs(
    conn: Conn, tenant_id: str, name: str, limit: int = 20
) -> list[dict[str, Any]]:
    """Return the latest runs that loaded `name`, with the version each pinned."""
    cur = await conn.execute(
        "SELECT run_id, version, content_hash, via, loaded_at FROM skill_loads"
        " WHERE tenant_id = %s AND name = %s ORDER BY loaded_at DESC LIMIT %s",
        (tenant_id, name, limit),
    )
    return [
        {
            "runId": r["run_id"],
            "version": r["version"],
            "hash": r["content_hash"],
            "via": r["via"],
            "loadedAt": r["loaded_at"].isoformat(),
        }
        for r in await cur.fetchall()
    ]
