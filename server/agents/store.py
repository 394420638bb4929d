"""Agent profiles in Postgres: every change is a new immutable version, per tenant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from server.agents.profiles import BUILTIN_DEFAULT, DEFAULT_AGENT, AgentSpec, parse_ref
from server.db.pool import Conn, Pool
from server.errors import (
    AgentExistsError,
    AgentNotFoundError,
    AgentReadOnlyError,
    UnknownAgentError,
)
from server.lifecycle import audit


@dataclass(frozen=True)
class AgentVersion:
    """One stored version of a profile (version 0: the built-in default)."""

    name: str
    version: int
    spec: AgentSpec
    source: str = "builtin"
    source_path: str | None = None
    created_by: str | None = None
    created_at: datetime | None = None

    def view(self) -> dict[str, Any]:
        """Render for the API."""
        return {
            "name": self.name,
            "version": self.version,
            "ref": f"{self.name}@{self.version}",
            "source": self.source,
            "sourcePath": self.source_path,
            "createdBy": self.created_by,
            "createdAt": self.created_at.isoformat() if self.created_at else None,
            "spec": self.spec.model_dump(mode="json", by_alias=True),
        }


BUILTIN = AgentVersion(DEFAULT_AGENT, 0, BUILTIN_DEFAULT)


def _version(row: dict[str, Any]) -> AgentVersion:
    return AgentVersion(
        row["name"],
        row["version"],
        AgentSpec.model_validate(row["spec"]),
        row["source"],
        row["source_path"],
        row["created_by"],
        row["created_at"],
    )


async def _lock(conn: Conn, tenant_id: str, name: str) -> None:
    # Versions of one name are numbered one at a time.
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtext('agent:' || %s || '/' || %s))", (tenant_id, name)
    )


async def _latest(
    conn: Conn, tenant_id: str, name: str, *, deleted: bool = False
) -> dict[str, Any] | None:
    cur = await conn.execute(
        "SELECT * FROM agent_profiles WHERE tenant_id = %s AND name = %s"
        + ("" if deleted else " AND deleted_at IS NULL")
        + " ORDER BY version DESC LIMIT 1",
        (tenant_id, name),
    )
    return await cur.fetchone()


async def _insert(
    conn: Conn,
    tenant_id: str,
    name: str,
    version: int,
    spec: AgentSpec,
    by: str | None,
    source: str,
    path: str | None,
) -> AgentVersion:
    cur = await conn.execute(
        "INSERT INTO agent_profiles (tenant_id, name, version, spec, source, source_path,"
        " created_by) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *",
        (
            tenant_id,
            name,
            version,
            Jsonb(spec.model_dump(mode="json", by_alias=True, exclude_unset=False)),
            source,
            path,
            by,
        ),
    )
    row = await cur.fetchone()
    assert row is not None
    return _version(row)


async def _audit(
    conn: Conn,
    tenant_id: str,
    by: str | None,
    action: str,
    new: AgentVersion,
    before: dict[str, Any] | None,
) -> None:
    after = new.spec.model_dump(mode="json", by_alias=True, exclude_unset=False)
    diff = {"version": new.version, "source": new.source, **audit.small_diff(before, after)}
    await audit.record(
        conn,
        tenant_id=tenant_id,
        actor=by or "agent-files",
        action=action,
        target=f"agent:{new.name}",
        diff=diff if before is not None else {"version": new.version, "source": new.source},
    )


async def create_profile(
    pool: Pool,
    tenant_id: str,
    name: str,
    spec: AgentSpec,
    *,
    by: str | None,
    source: str = "api",
    path: str | None = None,
) -> AgentVersion:
    """Create a profile (version 1, or the next number if the name was deleted before).

    Raises:
        AgentExistsError: a live profile has this name.
    """
    async with pool.connection() as conn, conn.transaction():
        await _lock(conn, tenant_id, name)
        if await _latest(conn, tenant_id, name) is not None:
            raise AgentExistsError(name)
        before = await _latest(conn, tenant_id, name, deleted=True)
        version = before["version"] + 1 if before else 1
        if before is not None:  # versions stay numbered across a delete
            await conn.execute(
                "UPDATE agent_profiles SET deleted_at = NULL WHERE tenant_id = %s AND name = %s",
                (tenant_id, name),
            )
        created = await _insert(conn, tenant_id, name, version, spec, by, source, path)
        await _audit(conn, tenant_id, by, "agent.created", created, None)
        return created


async def update_profile(
    pool: Pool,
    tenant_id: str,
    name: str,
    spec: AgentSpec,
    *,
    by: str | None,
    source: str = "api",
    path: str | None = None,
) -> tuple[AgentVersion, bool]:
    """Store `spec` as the profile's next version; return it and whether it is new.

    An unchanged spec makes no version (the latest is returned).

    Raises:
        AgentNotFoundError: no live profile of that name.
        AgentReadOnlyError: the API changing a profile declared in a file.
    """
    async with pool.connection() as conn, conn.transaction():
        await _lock(conn, tenant_id, name)
        latest = await _latest(conn, tenant_id, name)
        if latest is None:
            raise AgentNotFoundError(name)
        if latest["source"] == "file" and source != "file":
            raise AgentReadOnlyError(
                f"agent {name!r} is declared in {latest['source_path']}; change it there (it is "
                "synced when the server starts)"
            )
        current = _version(latest)
        if current.spec == spec and current.source == source:
            return current, False
        new = await _insert(conn, tenant_id, name, latest["version"] + 1, spec, by, source, path)
        await _audit(conn, tenant_id, by, "agent.updated", new, latest["spec"])
        return new, True


async def delete_profile(pool: Pool, tenant_id: str, name: str, *, by: str | None = None) -> None:
    """Delete a profile: new runs can no longer name it; its versions stay for the runs.

    Raises:
        AgentNotFoundError: no live profile of that name.
    """
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "UPDATE agent_profiles SET deleted_at = now() WHERE tenant_id = %s AND name = %s"
            " AND deleted_at IS NULL",
            (tenant_id, name),
        )
        if cur.rowcount == 0:
            raise AgentNotFoundError(name)
        await audit.record(
            conn,
            tenant_id=tenant_id,
            actor=by or "agent-files",
            action="agent.deleted",
            target=f"agent:{name}",
        )


async def list_profiles(pool: Pool, tenant_id: str) -> list[AgentVersion]:
    """Return the latest version of each live profile, by name (with the built-in default)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT DISTINCT ON (name) * FROM agent_profiles WHERE tenant_id = %s"
            " AND deleted_at IS NULL ORDER BY name, version DESC",
            (tenant_id,),
        )
        found = [_version(r) for r in await cur.fetchall()]
    if all(p.name != DEFAULT_AGENT for p in found):
        found.append(BUILTIN)
    return sorted(found, key=lambda p: p.name)


async def list_versions(pool: Pool, tenant_id: str, name: str) -> list[AgentVersion]:
    """Return every version of a live profile, newest first.

    Raises:
        AgentNotFoundError: no live profile of that name.
    """
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM agent_profiles WHERE tenant_id = %s AND name = %s"
            " AND deleted_at IS NULL ORDER BY version DESC",
            (tenant_id, name),
        )
        rows = await cur.fetchall()
    if not rows:
        if name == DEFAULT_AGENT:
            return [BUILTIN]
        raise AgentNotFoundError(name)
    return [_version(r) for r in rows]


async def find_version(
    conn: Conn, tenant_id: str, name: str, version: int | None, *, deleted: bool = False
) -> AgentVersion | None:
    """Return a version (the latest when `version` is None) of the tenant's profile, if any.

    `default` without a stored profile is the built-in default (version 0).
    """
    if version is None:
        row = await _latest(conn, tenant_id, name, deleted=deleted)
    else:
        cur = await conn.execute(
            "SELECT * FROM agent_profiles WHERE tenant_id = %s AND name = %s AND version = %s"
            + ("" if deleted else " AND deleted_at IS NULL"),
            (tenant_id, name, version),
        )
        row = await cur.fetchone()
    return _found(row, name, version)


def _found(row: dict[str, Any] | None, name: str, version: int | None) -> AgentVersion | None:
    if row is not None:
        return _version(row)
    if name == DEFAULT_AGENT and version in (None, 0):
        return BUILTIN
    return None


async def get_profile(pool: Pool, tenant_id: str, name: str, version: int | None) -> AgentVersion:
    """Return a version of a live profile (the latest when `version` is None).

    Raises:
        AgentNotFoundError: no such profile or version for the tenant.
    """
    async with pool.connection() as conn:
        found = await find_version(conn, tenant_id, name, version)
    if found is None:
        raise AgentNotFoundError(name, version)
    return found


async def resolve_agent(conn: Conn, tenant_id: str, ref: str | None) -> AgentVersion:
    """Pin the profile a new run uses: `name` is its latest version, `name@N` version N.

    Raises:
        UnknownAgentError: the reference is malformed, or the tenant has no such profile.
    """
    name, version = parse_ref(ref or DEFAULT_AGENT)
    found = await find_version(conn, tenant_id, name, version)
    if found is None:
        what = f"agent {name!r}" if version is None else f"version {version} of agent {name!r}"
        raise UnknownAgentError(
            f"{what} does not exist for your tenant; `GET /api/agents` lists the agents you "
            "can use, `GET /api/agents/{name}/versions` their versions"
        )
    return found


async def run_agent(conn: Conn, tenant_id: str, name: str, version: int) -> AgentVersion:
    """Return the exact version a run recorded (even if the profile was deleted since).

    Raises:
        AgentNotFoundError: the version is gone (its rows were removed by hand).
    """
    found = await find_version(conn, tenant_id, name, version, deleted=True)
    if found is None:
        raise AgentNotFoundError(name, version)
    return found


def recorded_agent(stored: dict[str, Any] | None, name: str, version: int) -> AgentVersion:
    """`run_agent` of the version's row as read elsewhere (`to_jsonb`; None: no row stored).

    Raises:
        AgentNotFoundError: the version is gone (its rows were removed by hand).
    """
    if stored is not None and isinstance(stored.get("created_at"), str):
        stored = {**stored, "created_at": datetime.fromisoformat(stored["created_at"])}
    found = _found(stored, name, version)
    if found is None:
        raise AgentNotFoundError(name, version)
    return found
