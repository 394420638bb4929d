"""Skills: list, read, upload (a new version), enable, disable, versions, usage (docs/skills.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from server.deps import SkillsDep
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, ApiModel, errors
from skills.format import MAX_RESOURCES, NAME_PATTERN
from tools.jsontypes import NotTextOrFlag

router = APIRouter(prefix="/api/skills", tags=["skills"], responses=COMMON_ERRORS)

SkillName = Annotated[
    str, Path(pattern=NAME_PATTERN, description="Lowercase letters, digits, '-' and '_'.")
]


class SkillIn(BaseModel):
    """Body of `POST /api/skills`: a skill folder's files."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    skill_md: str = Field(
        alias="skillMd", min_length=1, description="The text of SKILL.md: front matter, then body."
    )
    resources: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_RESOURCES,
        description="The folder's other text files, by relative path.",
    )


class EnableIn(BaseModel):
    """Body of `POST /api/skills/{name}/enable`."""

    model_config = ConfigDict(extra="forbid")

    version: Annotated[int, Field(ge=1, le=1_000_000_000), NotTextOrFlag] | None = Field(
        default=None, description="Pin this version; the latest if unset."
    )


class SkillOut(ApiModel):
    """One version of a skill, and the tenant's choices about it."""

    name: str
    description: str
    version: int = Field(description="Its number among the versions of its owner.")
    label: str = Field(description="The front matter's version, else the short content hash.")
    hash: str = Field(description="`sha256:` of SKILL.md and its resources: the exact version.")
    owner: str = Field(description="`repository` (the skills/ folder) or `tenant` (uploaded).")
    allowed_tools: list[str] | None
    resources: list[str]
    enabled: bool
    pinned_version: int | None


class SkillList(ApiModel):
    """The tenant's skills at their current versions, and repository folders that fail to parse."""

    skills: list[SkillOut]
    errors: list[dict[str, str]]


class SkillVersions(ApiModel):
    """Every version of a skill, newest first."""

    versions: list[SkillOut]


class SkillUsage(ApiModel):
    """Runs that loaded each version of a skill."""

    name: str
    versions: list[dict[str, Any]]
    recent_runs: list[dict[str, Any]]


@router.get("", response_model=SkillList)
async def get_skills(skills: SkillsDep) -> dict[str, Any]:
    """List the skills the tenant sees (repository and uploaded), at their current versions."""
    return await skills.list()


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SkillOut,
    responses={**BODY_ERRORS, **errors(403)},
)
async def post_skill(
    response: Response, body: Annotated[SkillIn, CleanText, Body()], skills: SkillsDep
) -> dict[str, Any]:
    """Upload a skill: a new immutable version of the tenant's skill of that name.

    Files equal to the latest version make no new version (answered 200 with it,
    `Skill-Version-Created: false`).
    """
    stored, created = await skills.upload(body.skill_md, body.resources)
    response.headers["Skill-Version-Created"] = "true" if created else "false"
    if not created:
        response.status_code = status.HTTP_200_OK
    return stored


@router.get("/{name}", response_model=SkillOut, responses=errors(404))
async def get_skill(
    name: SkillName,
    skills: SkillsDep,
    version: int | None = Query(None, ge=1, le=1_000_000_000, description="The latest if unset."),
) -> dict[str, Any]:
    """Return a skill's current version (or `version`) with its instructions."""
    return await skills.get(name, version)


@router.get("/{name}/versions", response_model=SkillVersions, responses=errors(404))
async def get_skill_versions(name: SkillName, skills: SkillsDep) -> dict[str, Any]:
    """List every version of a skill, newest first."""
    return await skills.versions(name)


@router.post(
    "/{name}/enable", response_model=SkillOut, responses={**BODY_ERRORS, **errors(403, 404)}
)
async def enable_skill(
    name: SkillName, skills: SkillsDep, body: Annotated[EnableIn | None, Body()] = None
) -> dict[str, Any]:
    """Enable a skill for the tenant's runs, pinned to `version` or following the latest."""
    return await skills.set_enabled(name, True, body.version if body else None)


@router.post("/{name}/disable", response_model=SkillOut, responses=errors(403, 404))
async def disable_skill(name: SkillName, skills: SkillsDep) -> dict[str, Any]:
    """Disable a skill: new loads are refused; runs that loaded it keep their version."""
    return await skills.set_enabled(name, False)


@router.get("/{name}/usage", response_model=SkillUsage, responses=errors(404))
async def get_skill_usage(name: SkillName, skills: SkillsDep) -> dict[str, Any]:
    """Return how many runs loaded each version of the skill, and the latest of those runs."""
    return await skills.usage(name)
