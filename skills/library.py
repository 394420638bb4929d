"""Where a run finds its skills: the `SkillLibrary` protocol and an in-memory library.

The server implements the protocol on Postgres (server/skills/library.py) for one run: the
tenant's enabled skills, narrowed to those its agent profile may use. Tools and context
sections reach the run's library through the run's section options (`skills.library`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from skills.format import Skill


class SkillUnavailableError(Exception):
    """A skill the run cannot load: unknown, disabled, not allowed, or broken.

    The message is written for the model, which reads it as the tool's error.
    """


@dataclass(frozen=True)
class LibrarySkill:
    """A skill as a run's library offers it: the parsed skill and where it comes from.

    Attributes:
        skill: The parsed version.
        version: Its number (1, 2...) among the versions of its owner.
        owner: `repository` (the `skills/` folder, every tenant) or `tenant` (uploaded).
    """

    skill: Skill
    version: int
    owner: str


@dataclass(frozen=True)
class SkillSummary:
    """What a listing shows of a skill's current version: no instructions, no files."""

    name: str
    description: str
    version: int
    label: str
    hash: str
    owner: str


def summary_of(entry: LibrarySkill) -> SkillSummary:
    """Return the summary of a parsed skill."""
    skill = entry.skill
    return SkillSummary(
        skill.name, skill.description, entry.version, skill.label, skill.content_hash, entry.owner
    )


class SkillLibrary(Protocol):
    """The skills one run may use."""

    async def available(self) -> Sequence[SkillSummary]:
        """Return the skills the run may load now (their current versions)."""
        ...

    async def get(self, name: str, content_hash: str | None = None) -> LibrarySkill:
        """Return the skill's current version, or the exact version `content_hash` names.

        Raises:
            SkillUnavailableError: unknown, disabled, not allowed, or it fails to parse.
        """
        ...


def allows(allowed: Sequence[str] | None, name: str) -> bool:
    """Say whether a profile's skill list (`["*"]`: all, None or `[]`: none) names `name`."""
    return bool(allowed) and ("*" in (allowed or ()) or name in (allowed or ()))


@dataclass
class InMemorySkillLibrary:
    """A library over parsed skills, for tests and for graphs run without the server.

    Attributes:
        skills: Every version known, oldest first per name; the last one is current.
        allowed: The profile's skill list (`["*"]` allows all).
        broken: Skills that failed to parse, with why.
        disabled: Names the tenant disabled.
    """

    skills: list[LibrarySkill] = field(default_factory=list)
    allowed: Sequence[str] | None = ("*",)
    broken: Mapping[str, str] = field(default_factory=dict)
    disabled: frozenset[str] = frozenset()

    @classmethod
    def of(cls, skills: Iterable[Skill], **options: object) -> InMemorySkillLibrary:
        """Return a library holding `skills` as repository skills, numbered per name."""
        counts: dict[str, int] = {}
        entries: list[LibrarySkill] = []
        for skill in skills:
            counts[skill.name] = counts.get(skill.name, 0) + 1
            entries.append(LibrarySkill(skill, counts[skill.name], "repository"))
        return cls(entries, **options)  # type: ignore[arg-type]

    def add(self, skill: Skill, owner: str = "tenant") -> LibrarySkill:
        """Add a new version of `skill` and return it."""
        version = 1 + sum(1 for e in self.skills if e.skill.name == skill.name)
        entry = LibrarySkill(skill, version, owner)
        self.skills.append(entry)
        return entry

    async def available(self) -> Sequence[SkillSummary]:
        """Return the current version of every skill the run may load."""
        current: dict[str, LibrarySkill] = {}
        for entry in self.skills:
            current[entry.skill.name] = entry
        return [
            summary_of(e)
            for n, e in sorted(current.items())
            if allows(self.allowed, n) and n not in self.disabled
        ]

    async def get(self, name: str, content_hash: str | None = None) -> LibrarySkill:
        """Return the current version of `name` or the exact one `content_hash` names."""
        check_loadable(name, self.allowed, self.broken, self.disabled, pinned=content_hash)
        versions = [e for e in self.skills if e.skill.name == name]
        if content_hash is not None:
            versions = [e for e in versions if e.skill.content_hash == content_hash]
        if not versions:
            raise unknown(name, [e.name for e in await self.available()])
        return versions[-1]


def unknown(name: str, known: Iterable[str]) -> SkillUnavailableError:
    """The error for a skill nobody has: it names the skills the run can load."""
    names = ", ".join(sorted(known)) or "none"
    return SkillUnavailableError(f"there is no skill {name!r}; the skills you can load: {names}")


def check_loadable(
    name: str,
    allowed: Sequence[str] | None,
    broken: Mapping[str, str],
    disabled: Iterable[str],
    *,
    pinned: str | None = None,
) -> None:
    """Refuse a skill the profile does not allow, that is broken, or (unless pinned) disabled.

    A version the run already loaded stays usable if the tenant disables the skill meanwhile:
    the run keeps the version it pinned.

    Raises:
        SkillUnavailableError: with a message the model can act on.
    """
    if not allows(allowed, name):
        raise SkillUnavailableError(
            f"skill {name!r} is not one this agent may use; use one listed in <skills>"
        )
    if name in broken:
        raise SkillUnavailableError(
            f"skill {name!r} fails to parse, so it cannot be loaded: {broken[name]}"
        )
    if pinned is None and name in set(disabled):
        raise SkillUnavailableError(f"skill {name!r} is disabled for this tenant")
