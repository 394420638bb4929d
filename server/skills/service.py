"""What the API asks of skills: list, read, upload, enable, disable, versions, usage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.auth import Principal
from server.db.pool import Pool
from server.errors import (
    InvalidSkillError,
    SkillForbiddenError,
    SkillNotFoundError,
    UnknownReferenceError,
)
from server.lifecycle import audit
from server.skills.store import (
    add_version,
    current_skill,
    current_skills,
    set_choice,
    skill_errors,
    skill_versions,
)
from server.skills.usage import skill_runs, skill_usage
from skills.format import SkillFormatError, parse_skill


def _require_admin(who: Principal) -> None:
    if not who.has_role("admin"):
        raise SkillForbiddenError("changing skills needs the tenant's admin role")


class SkillService:
    """The skills of the caller's tenant.

    Args:
        pool: The process's pool.
        who: The caller; every query is scoped by its tenant.
    """

    def __init__(self, pool: Pool, who: Principal) -> None:
        self.pool = pool
        self.who = who

    async def list(self) -> dict[str, Any]:
        """Return every skill the tenant sees, at its current version, and the broken ones."""
        async with self.pool.connection() as conn:
            found = await current_skills(conn, self.who.tenant_id)
            broken = await skill_errors(conn)
        return {
            "skills": [s.view() for s in found],
            "errors": [{"name": n, "error": e} for n, e in sorted(broken.items())],
        }

    async def get(self, name: str, version: int | None = None) -> dict[str, Any]:
        """Return one skill (its current version, or `version`) with its instructions."""
        async with self.pool.connection() as conn:
            if version is None:
                return (await current_skill(conn, self.who.tenant_id, name)).view(full=True)
            for stored in await skill_versions(conn, self.who.tenant_id, name):
                if stored.entry.version == version:
                    return stored.view(full=True)
        raise SkillNotFoundError(f"skill {name!r} has no version {version}")

    async def upload(
        self, skill_md: str, resources: Mapping[str, str]
    ) -> tuple[dict[str, Any], bool]:
        """Store an uploaded skill as the tenant's next version; return it and if it is new.

        Raises:
            SkillForbiddenError: the caller is not a tenant admin.
            InvalidSkillError: the SKILL.md or a resource does not follow the format.
        """
        _require_admin(self.who)
        try:
            skill = parse_skill(skill_md, resources)
        except SkillFormatError as exc:
            raise InvalidSkillError(str(exc)) from exc
        async with self.pool.connection() as conn, conn.transaction():
            version, created = await add_version(
                conn, self.who.tenant_id, skill, "upload", self.who.user_id
            )
            if created:
                await audit.record(
                    conn,
                    tenant_id=self.who.tenant_id,
                    actor=self.who.user_id,
                    action="skill.uploaded",
                    target=f"skill:{skill.name}",
                    diff={"version": version, "resources": sorted(resources)},
                )
            for stored in await skill_versions(conn, self.who.tenant_id, skill.name):
                if stored.entry.version == version:
                    return stored.view(full=True), created
        raise SkillNotFoundError(f"skill {skill.name!r} vanished while it was stored")

    async def set_enabled(
        self, name: str, enabled: bool, version: int | None = None
    ) -> dict[str, Any]:
        """Enable (optionally pinned to `version`; None follows the latest) or disable a skill.

        Raises:
            SkillForbiddenError: the caller is not a tenant admin.
            SkillNotFoundError: no such skill.
            UnknownReferenceError: the skill has no such version.
        """
        _require_admin(self.who)
        async with self.pool.connection() as conn:
            versions = await skill_versions(conn, self.who.tenant_id, name)
            if version is not None and version not in {s.entry.version for s in versions}:
                known = ", ".join(str(s.entry.version) for s in versions)
                raise UnknownReferenceError(
                    f"skill {name!r} has no version {version}; its versions: {known}"
                )
            async with conn.transaction():
                await set_choice(
                    conn,
                    self.who.tenant_id,
                    name,
                    enabled=enabled,
                    pinned=version if enabled else versions[0].pinned_version,
                    by=self.who.user_id,
                )
                await audit.record(
                    conn,
                    tenant_id=self.who.tenant_id,
                    actor=self.who.user_id,
                    action="skill.enabled" if enabled else "skill.disabled",
                    target=f"skill:{name}",
                    diff={"pinnedVersion": version} if enabled else {},
                )
            return (await current_skill(conn, self.who.tenant_id, name)).view()

    async def versions(self, name: str) -> dict[str, Any]:
        """Return every version of a skill, newest first."""
        async with self.pool.connection() as conn:
            found = await skill_versions(conn, self.who.tenant_id, name)
        return {"versions": [s.view() for s in found]}

    async def usage(self, name: str) -> dict[str, Any]:
        """Return how many runs loaded each version of a skill, and the latest runs."""
        async with self.pool.connection() as conn:
            await skill_versions(conn, self.who.tenant_id, name)  # 404 for unknown names
            return {
                "name": name,
                "versions": await skill_usage(conn, self.who.tenant_id, name),
                "recentRuns": await skill_runs(conn, self.who.tenant_id, name),
            }
