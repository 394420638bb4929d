"""What every model call of a run was sent: the context manifests."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from server.agents.context_store import run_manifests
from server.deps import PoolDep, PrincipalDep
from server.routes.schemas import COMMON_ERRORS, ApiModel, errors
from server.runs.records import get_run

router = APIRouter(prefix="/api/runs", tags=["runs"], responses=COMMON_ERRORS)


class RunContextView(ApiModel):
    """A run's context manifests, one per model call (step) and attempt (docs/context.md)."""

    run_id: str
    agent: dict[str, Any]
    manifests: list[dict[str, Any]]


@router.get("/{run_id}/context", response_model=RunContextView, responses=errors(404))
async def get_run_context(
    run_id: str,
    pool: PoolDep,
    who: PrincipalDep,
    step: int | None = Query(None, ge=1, le=1_000_000, description="Only this step's model call."),
    attempt: int | None = Query(
        None, ge=1, le=1_000_000, description="Only this attempt of the run."
    ),
) -> dict[str, Any]:
    """Return what went into each model call of the run, what was left out, and why."""
    async with pool.connection() as conn:
        run = await get_run(conn, who, run_id)
        manifests = await run_manifests(conn, run_id, step, attempt)
    return {
        "runId": run_id,
        "agent": {"name": run.agent_name, "version": run.agent_version},
        "manifests": manifests,
    }
