"""Skills in Postgres: immutable versions per owner, each tenant's choices, the repository sync.

Owner `''` holds the repository's skills (the `skills/` folder), which every tenant sees; a
tenant's upload of the same name takes its place for that tenant. A tenant can disable a
skill or pin it to one version; otherwise runs get the latest version.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from server.db.pool import Conn, Pool
from server.errors import SkillNotFoundError
from skills.format import Skill, parse_skill, scan
from skills.library import LibrarySkill, SkillSummary

log = logging.getLogger(__name__)
REPOSITORY = ""


@dataclass(frozen=True)
class StoredSkill:
    """One stored version of a skill, and the tenant's choices about its name."""

    entry: LibrarySkill
    created_by: str | None
    created_at: datetime
    enabled: bool = True
    pinned_version: int | None = None

    @property
    def skill(self) -> Skill:
        """The parsed skill."""
        return self.entry.skill

    def view(self, *, full: bool = False) -> dict[str, Any]:
        """Render for the API; `full` adds the instructions and the resources' text."""
        skill = self.skill
        out: dict[str, Any] = {
            "name": skill.name,
            "description": skill.description,
            "version": self.entry.version,
            "label": skill.label,
            "hash": skill.content_hash,
            "owner": self.entry.owner,
            "allowedTools": None if skill.allowed_tools is None else list(skill.allowed_tools),
            "model": skill.model,
            "tags": list(skill.tags),
            "license": skill.license,
            "resources": sorted(skill.resources),
            "enabled": self.enabled,
            "pinnedVersion": self.pinned_version,
            "createdBy": self.created_by,
            "createdAt": self.created_at.isoformat(),
        }
        if full:
            out["instructions"] = skill.instructions
            out["skillMd"] = skill.skill_md
            out["frontMatter"] = dict(skill.front_matter)
        return out


def _owner(tenant_id: str) -> str:
    return "repository" if tenant_id == REPOSITORY else "tenant"


def _stored(row: dict[str, Any]) -> StoredSkill:
    skill = parse_skill(row["skill_md"], row["resources"])
    return StoredSkill(
        LibrarySkill(skill, row["version"], _owner(row["tenant_id"])),
        row["created_by"],
        row["created_at"],
        row.get("enabled") is not False,
        row.get("pinned_version"),
    )


async def _lock(conn: Conn, tenant_id: str, name: str) -> None:
    # Versions of one name are numbered one at a time.
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtext('skill:' || %s || '/' || %s))", (tenant_id, name)
    )


async def add_version(
    conn: Conn, tenant_id: str, skill: Skill, source: str, by: str | None
) -> tuple[int, bool]:
    """Store `skill` as the owner's next version unless it equals the latest one.

    Returns:
        The version number, and whether it is new.
    """
    async with conn.transaction():
        await _lock(conn, tenant_id, skill.name)
        cur = await conn.execute(
            "SELECT version, content_hash FROM skill_versions WHERE tenant_id = %s AND name = %s"
            " ORDER BY version DESC LIMIT 1",
            (tenant_id, skill.name),
        )
        latest = await cur.fetchone()
        if latest is not None and latest["content_hash"] == skill.content_hash:
            return int(latest["version"]), False
        version = 1 + (int(latest["version"]) if latest else 0)
        await conn.execute(
            "INSERT INTO skill_versions (tenant_id, name, version, content_hash, description,"
            " label, skill_md, resources, source, created_by)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                tenant_id,
                skill.name,
                version,
                skill.content_hash,
                skill.description,
                skill.label,
                skill.skill_md,
                Jsonb(dict(skill.resources)),
                source,
                by,
            ),
        )
    return version, True


async def sync_repository(pool: Pool, root: Path) -> dict[str, str]:
    """Store a new version of every repository skill whose files changed; return the errors.

    Folders that fail to parse are recorded in `skill_errors`, so that a run loading one is
    told why; they are logged here too.
    """
    found, errors = scan(root)
    async with pool.connection() as conn:
        for skill in found:
            version, created = await add_version(conn, REPOSITORY, skill, "repository", None)
            if created:
                log.info("skill %s: version %d from %s", skill.name, version, root / skill.name)
        async with conn.transaction():
            await conn.execute("DELETE FROM skill_errors")
            for name, error in errors.items():
                log.warning("skill folder %s is not loaded: %s", root / name, error)
                await conn.execute(
                    "INSERT INTO skill_errors (name, error) VALUES (%s, %s)", (name, error)
                )
    return errors


# The current version of every skill a tenant sees: its own versions take the place of the
# repository's, a pin picks a version, and the tenant's choices come along.
_CURRENT = """
WITH owners AS (
    SELECT DISTINCT ON (name) name, tenant_id FROM skill_versions
    WHERE tenant_id IN (%(tenant)s, '') AND (%(name)s::text IS NULL OR name = %(name)s)
    ORDER BY name, (tenant_id = %(tenant)s) DESC
)
SELECT DISTINCT ON (v.name) {columns}, t.enabled, t.pinned_version
FROM owners o
JOIN skill_versions v ON v.tenant_id = o.tenant_id AND v.name = o.name
LEFT JOIN tenant_skills t ON t.tenant_id = %(tenant)s AND t.name = v.name
WHERE t.pinned_version IS NULL OR v.version = t.pinned_version
ORDER BY v.name, v.version DESC
"""


async def current_skills(conn: Conn, tenant_id: str, name: str | None = None) -> list[StoredSkill]:
    """Return the current version of every skill the tenant sees (or of `name`)."""
    cur = await conn.execute(_CURRENT.format(columns="v.*"), {"tenant": tenant_id, "name": name})
    return [_stored(r) for r in await cur.fetchall()]


_LISTED = "v.tenant_id, v.name, v.version, v.content_hash, v.description, v.label"


async def current_summaries(conn: Conn, tenant_id: str) -> list[tuple[SkillSummary, bool]]:
    """Return the current version of every skill the tenant sees, unparsed, and if enabled."""
    cur = await conn.execute(_CURRENT.format(columns=_LISTED), {"tenant": tenant_id, "name": None})
    return [
        (
            SkillSummary(
                r["name"],
                r["description"],
                r["version"],
                r["label"],
                r["content_hash"],
                _owner(r["tenant_id"]),
            ),
            r["enabled"] is not False,
        )
        for r in await cur.fetchall()
    ]


async def current_skill(conn: Conn, tenant_id: str, name: str) -> StoredSkill:
    """Return the current version of one skill.

    Raises:
        SkillNotFoundError: the tenant sees no skill of that name.
    """
    found = await current_skills(conn, tenant_id, name)
    if not found:
        raise SkillNotFoundError(f"skill {name!r} not found")
    return found[0]


async def skill_versions(conn: Conn, tenant_id: str, name: str) -> list[StoredSkill]:
    """Return every version of `name` the tenant sees, newest first.

    They are the tenant's own versions if it uploaded any, else the repository's.

    Raises:
        SkillNotFoundError: the tenant sees no skill of that name.
    """
    cur = await conn.execute(
        "SELECT v.*, t.enabled, t.pinned_version FROM skill_versions v"
        " LEFT JOIN tenant_skills t ON t.tenant_id = %(tenant)s AND t.name = v.name"
        " WHERE v.name = %(name)s AND v.tenant_id = (SELECT tenant_id FROM skill_versions"
        "  WHERE tenant_id IN (%(tenant)s, '') AND name = %(name)s"
        "  ORDER BY (tenant_id = %(tenant)s) DESC LIMIT 1)"
        " ORDER BY v.version DESC",
        {"tenant": tenant_id, "name": name},
    )
    found = [_stored(r) for r in await cur.fetchall()]
    if not found:
        raise SkillNotFoundError(f"skill {name!r} not found")
    return found


async def version_by_hash(
    conn: Conn, tenant_id: str, name: str, content_hash: str
) -> StoredSkill | None:
    """Return the version of `name` with this content hash (the tenant's or the repository's)."""
    cur = await conn.execute(
        "SELECT * FROM skill_versions WHERE tenant_id IN (%s, '') AND name = %s"
        " AND content_hash = %s ORDER BY (tenant_id = %s) DESC, version DESC LIMIT 1",
        (tenant_id, name, content_hash, tenant_id),
    )
    row = await cur.fetchone()
    return _stored(row) if row else None


async def skill_errors(conn: Conn) -> dict[str, str]:
    """Return the repository's skill folders that failed to parse, with why."""
    cur = await conn.execute("SELECT name, error FROM skill_errors")
    return {r["name"]: r["error"] for r in await cur.fetchall()}


async def disabled_names(conn: Conn, tenant_id: str) -> set[str]:
    """Return the skill names the tenant disabled."""
    cur = await conn.execute(
        "SELECT name FROM tenant_skills WHERE tenant_id = %s AND NOT enabled", (tenant_id,)
    )
    return {r["name"] for r in await cur.fetchall()}


async def set_choice(
    conn: Conn, tenant_id: str, name: str, *, enabled: bool, pinned: int | None, by: str
) -> None:
    """Store the tenant's choice for `name`: enabled or not, and the pinned version."""
    await conn.execute(
        "INSERT INTO tenant_skills (tenant_id, name, enabled, pinned_version, updated_by)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant_id, name) DO UPDATE SET"
        " enabled = EXCLUDED.enabled, pinned_version = EXCLUDED.pinned_version,"
        " updated_by = EXCLUDED.updated_by, updated_at = now()",
        (tenant_id, name, enabled, pinned, by),
    )
