"""Agent profiles: create, list, read, update (a new version), list versions, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response, status
from pydantic import Field

from server.agents.profiles import NAME_PATTERN, AgentSpec
from server.agents.store import (
    create_profile,
    delete_profile,
    get_profile,
    list_profiles,
    list_versions,
    update_profile,
)
from server.auth import Principal
from server.deps import ModelsDep, PoolDep, PrincipalDep
from server.errors import AgentForbiddenError
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, ApiModel, errors
from server.usage.registry import ModelRegistry

router = APIRouter(prefix="/api/agents", tags=["agents"], responses=COMMON_ERRORS)

AgentName = Annotated[
    str, Path(pattern=NAME_PATTERN, description="Lowercase letters, digits, '-' and '_'.")
]


class AgentIn(AgentSpec):
    """Body of `POST /api/agents`: a name and the profile's fields."""

    name: str = Field(pattern=NAME_PATTERN, description="Lowercase letters, digits, '-', '_'.")


class Agent(ApiModel):
    """One version of an agent profile."""

    name: str
    version: int = Field(description="Every change makes a new version; 0 is the built-in.")
    ref: str = Field(description="`name@version`, what a message may name to pin it.")
    source: str = Field(description="`api`, `file` (declared in agents/*.yaml) or `builtin`.")
    source_path: str | None
    created_by: str | None
    created_at: str | None
    spec: dict[str, Any]


class AgentList(ApiModel):
    """The tenant's agents, each at its latest version."""

    agents: list[Agent]


class AgentVersions(ApiModel):
    """Every version of one agent, newest first."""

    versions: list[Agent]


def _require_admin(who: Principal) -> None:
    if not who.has_role("admin"):
        raise AgentForbiddenError("changing agent profiles needs the tenant's admin role")


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=Agent,
    responses={**BODY_ERRORS, **errors(403, 409)},
)
async def post_agent(
    body: Annotated[AgentIn, CleanText, Body()],
    pool: PoolDep,
    models: ModelsDep,
    who: PrincipalDep,
) -> dict[str, Any]:
    """Create an agent profile (version 1)."""
    _require_admin(who)
    spec = AgentSpec.model_validate(body.model_dump(exclude={"name"}, exclude_unset=True))
    _check_models(models, spec)
    created = await create_profile(pool, who.tenant_id, body.name, spec, by=who.user_id)
    return created.view()


@router.get("", response_model=AgentList)
async def get_agents(pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """List the tenant's agents at their latest versions (`default` is always there)."""
    found = await list_profiles(pool, who.tenant_id)
    return {"agents": [a.view() for a in found]}


@router.get("/{name}", response_model=Agent, responses=errors(404))
async def get_agent(
    name: AgentName,
    pool: PoolDep,
    who: PrincipalDep,
    version: int | None = Query(
        None, ge=0, le=1_000_000_000, description="A version; the latest when unset."
    ),
) -> dict[str, Any]:
    """Return an agent's latest version, or the version asked for."""
    return (await get_profile(pool, who.tenant_id, name, version)).view()


@router.put("/{name}", response_model=Agent, responses={**BODY_ERRORS, **errors(403, 404, 409)})
async def put_agent(
    response: Response,
    name: AgentName,
    body: Annotated[AgentSpec, CleanText, Body()],
    pool: PoolDep,
    models: ModelsDep,
    who: PrincipalDep,
) -> dict[str, Any]:
    """Replace the agent's profile: a new version for new runs; running ones keep theirs.

    An unchanged body makes no version (answered with the latest, `Agent-Version-Created:
    false`).
    """
    _require_admin(who)
    _check_models(models, body)
    version, created = await update_profile(pool, who.tenant_id, name, body, by=who.user_id)
    response.headers["Agent-Version-Created"] = "true" if created else "false"
    return version.view()


@router.get("/{name}/versions", response_model=AgentVersions, responses=errors(404))
async def get_agent_versions(name: AgentName, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """List every version of an agent, newest first."""
    found = await list_versions(pool, who.tenant_id, name)
    return {"versions": [a.view() for a in found]}


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(403, 404))
async def delete_agent(name: AgentName, pool: PoolDep, who: PrincipalDep) -> Response:
    """Delete an agent: new runs can no longer use it; past runs keep their version."""
    _require_admin(who)
    await delete_profile(pool, who.tenant_id, name, by=who.user_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _check_models(models: ModelRegistry, spec: AgentSpec) -> None:
    """Refuse models the server cannot call (UnknownModelError: 400 unknown_model)."""
    for model in [spec.model, spec.context.summary.model, *(spec.fallbacks or [])]:
        if model is not None:
            models.validate(model)
