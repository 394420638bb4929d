"""A run's skill library on Postgres: the tenant's enabled skills its profile may use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from server.db.pool import Pool
from server.skills.store import (
    current_skills,
    current_summaries,
    disabled_names,
    skill_errors,
    version_by_hash,
)
from skills.library import (
    LibrarySkill,
    SkillSummary,
    SkillUnavailableError,
    allows,
    check_loadable,
    unknown,
)


@dataclass
class PostgresSkillLibrary:
    """The skills one run may use, read from the database when asked.

    Attributes:
        pool: The process's pool.
        tenant_id: The run's tenant.
        allowed: The profile's skill list (`["*"]`: every skill of the tenant).
    """

    pool: Pool
    tenant_id: str
    allowed: Sequence[str] | None
    _pinned: dict[tuple[str, str], LibrarySkill] = field(default_factory=dict, repr=False)

    async def available(self) -> Sequence[SkillSummary]:
        """Return the current version of every enabled skill the profile allows."""
        async with self.pool.connection() as conn:
            found = await current_summaries(conn, self.tenant_id)
        return [s for s, enabled in found if enabled and allows(self.allowed, s.name)]

    async def get(self, name: str, content_hash: str | None = None) -> LibrarySkill:
        """Return the current version of `name`, or the exact version `content_hash` names.

        Raises:
            SkillUnavailableError: unknown, disabled, not allowed, or broken.
        """
        if content_hash is not None and (name, content_hash) in self._pinned:
            return self._pinned[(name, content_hash)]
        async with self.pool.connection() as conn:
            broken = await skill_errors(conn)
            disabled = await disabled_names(conn, self.tenant_id)
            check_loadable(name, self.allowed, broken, disabled, pinned=content_hash)
            if content_hash is not None:
                stored = await version_by_hash(conn, self.tenant_id, name, content_hash)
                if stored is None:
                    raise SkillUnavailableError(
                        f"the version of skill {name!r} this run pinned ({content_hash}) is gone"
                    )
                self._pinned[(name, content_hash)] = stored.entry
                return stored.entry
            found = await current_skills(conn, self.tenant_id, name)
        if not found:
            raise unknown(name, [s.name for s in await self.available()])
        return found[0].entry
