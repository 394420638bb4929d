"""The artifact records: `artifacts` and `artifact_versions` (migration 0015).

A version is begun (a `writing` row, keyed by the tool call's idempotency key) before its
content is stored and finished (`ready`, with size and checksum) after, so a crash in between
leaves a row the call's next run finishes, never a second version.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from psycopg.types.json import Jsonb

from server.db.pool import Conn, Pool
from server.ids import new_id


@dataclass(frozen=True)
class Version:
    """One version of an artifact, with its artifact's name."""

    artifact_id: str
    version: int
    name: str
    tenant_id: str
    run_id: str
    tool_call_id: str
    media_type: str
    size: int | None
    checksum: str | None
    metadata: dict[str, Any]
    object_key: str
    status: str
    created_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Version:
        """Build from an `artifact_versions` row joined with its artifact's name."""
        return cls(**{f: row[f] for f in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Artifact:
    """An artifact: its record and its ready versions, oldest first."""

    id: str
    tenant_id: str
    user_id: str
    conversation_id: str
    run_id: str
    name: str
    latest_version: int
    created_at: datetime
    updated_at: datetime
    versions: tuple[Version, ...] = ()

    @property
    def latest(self) -> Version | None:
        """The newest ready version."""
        return self.versions[-1] if self.versions else None


@dataclass(frozen=True)
class Owner:
    """Whose run writes: the server fills this from the run, never from the tool."""

    tenant_id: str
    user_id: str
    conversation_id: str
    run_id: str


def object_key(tenant_id: str, artifact_id: str, idempotency_key: str) -> str:
    """Return where a version's bytes are stored: stable for the call that writes it."""
    return f"{quote(tenant_id, safe='')}/{artifact_id}/{quote(idempotency_key, safe='')}"


_VERSION = """
SELECT v.*, a.name FROM artifact_versions v JOIN artifacts a ON a.id = v.artifact_id
"""
# Locks the artifact row, so version numbers are handed out one at a time per artifact.
_UPSERT = """
INSERT INTO artifacts (id, tenant_id, user_id, conversation_id, run_id, name)
VALUES (%(id)s, %(tenant_id)s, %(user_id)s, %(conversation_id)s, %(run_id)s, %(name)s)
ON CONFLICT (conversation_id, name) DO UPDATE SET updated_at = artifacts.updated_at
RETURNING id
"""
_BEGIN = """
INSERT INTO artifact_versions (artifact_id, version, tenant_id, run_id, tool_call_id,
                               idempotency_key, media_type, metadata, object_key)
SELECT %(artifact_id)s, coalesce(max(version), 0) + 1, %(tenant_id)s, %(run_id)s,
       %(tool_call_id)s, %(key)s, %(media_type)s, %(metadata)s, %(object_key)s
FROM artifact_versions WHERE artifact_id = %(artifact_id)s
"""


async def begin_version(
    pool: Pool,
    owner: Owner,
    *,
    name: str,
    tool_call_id: str,
    idempotency_key: str,
    media_type: str,
    metadata: dict[str, Any],
) -> Version:
    """Return the version this call writes: the one it began before, or a new `writing` one."""
    async with pool.connection() as conn, conn.transaction():
        found = await _by_key(conn, idempotency_key)
        if found is not None:
            return found
        cur = await conn.execute(
            _UPSERT,
            {
                "id": new_id("art"),
                "tenant_id": owner.tenant_id,
                "user_id": owner.user_id,
                "conversation_id": owner.conversation_id,
                "run_id": owner.run_id,
                "name": name,
            },
        )
        row = await cur.fetchone()
        assert row is not None
        artifact_id = row["id"]
        await conn.execute(
            _BEGIN,
            {
                "artifact_id": artifact_id,
                "tenant_id": owner.tenant_id,
                "run_id": owner.run_id,
                "tool_call_id": tool_call_id,
                "key": idempotency_key,
                "media_type": media_type,
                "metadata": Jsonb(metadata),
                "object_key": object_key(owner.tenant_id, artifact_id, idempotency_key),
            },
        )
        found = await _by_key(conn, idempotency_key)
    assert found is not None
    return found


async def finish_version(pool: Pool, version: Version, *, size: int, checksum: str) -> Version:
    """Mark a version's content stored, and make it its artifact's latest if it is newer."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "UPDATE artifact_versions SET status = 'ready', size = %s, checksum = %s,"
            " stored_at = now() WHERE artifact_id = %s AND version = %s",
            (size, checksum, version.artifact_id, version.version),
        )
        await conn.execute(
            "UPDATE artifacts SET latest_version = greatest(latest_version, %s), updated_at = now()"
            " WHERE id = %s",
            (version.version, version.artifact_id),
        )
        cur = await conn.execute(
            _VERSION + " WHERE v.artifact_id = %s AND v.version = %s",
            (version.artifact_id, version.version),
        )
        row = await cur.fetchone()
    assert row is not None
    return Version.from_row(row)


async def _by_key(conn: Conn, idempotency_key: str) -> Version | None:
    cur = await conn.execute(_VERSION + " WHERE v.idempotency_key = %s", (idempotency_key,))
    row = await cur.fetchone()
    return Version.from_row(row) if row else None


async def load_artifacts(conn: Conn, tenant_id: str, ids: list[str]) -> list[Artifact]:
    """Return the tenant's artifacts among `ids` with their ready versions, oldest first."""
    cur = await conn.execute(
        "SELECT * FROM artifacts WHERE id = ANY(%s) AND tenant_id = %s AND latest_version > 0"
        " ORDER BY created_at, id",
        (ids, tenant_id),
    )
    rows = await cur.fetchall()
    cur = await conn.execute(
        _VERSION + " WHERE v.artifact_id = ANY(%s) AND v.status = 'ready'"
        " ORDER BY v.artifact_id, v.version",
        ([r["id"] for r in rows],),
    )
    versions: dict[str, list[Version]] = {}
    for row in await cur.fetchall():
        versions.setdefault(row["artifact_id"], []).append(Version.from_row(row))
    fields = Artifact.__dataclass_fields__
    return [
        Artifact(
            **{f: r[f] for f in fields if f != "versions"},
            versions=tuple(versions.get(r["id"], [])),
        )
        for r in rows
    ]


async def artifact_ids_of_runs(conn: Conn, tenant_id: str, run_ids: list[str]) -> list[str]:
    """Return the ids of the tenant's artifacts that any of `run_ids` wrote a version of."""
    cur = await conn.execute(
        "SELECT DISTINCT artifact_id FROM artifact_versions"
        " WHERE run_id = ANY(%s) AND tenant_id = %s AND status = 'ready'",
        (run_ids, tenant_id),
    )
    return [r["artifact_id"] for r in await cur.fetchall()]
