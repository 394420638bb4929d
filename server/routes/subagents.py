"""Subagents: a run's child runs, and retrying a child on its own (docs/subagents.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from server.deps import PrincipalDep, SubagentDep
from server.routes.schemas import COMMON_ERRORS, Children, Run, errors
from server.runs.views import run_view

router = APIRouter(prefix="/api/runs", tags=["subagents"], responses=COMMON_ERRORS)


@router.get("/{run_id}/children", response_model=Children, responses=errors(404))
async def get_children(run_id: str, service: SubagentDep, who: PrincipalDep) -> dict[str, Any]:
    """List the run's child runs (its subagents), oldest first, with their live status."""
    return {"runId": run_id, "children": await service.children(who, run_id)}


@router.post("/{run_id}/retry", status_code=202, response_model=Run, responses=errors(404, 409))
async def retry_run(run_id: str, service: SubagentDep, who: PrincipalDep) -> dict[str, Any]:
    """Run a finished subagent's task again as a new child run; its parent waits for it.

    Only while the parent still waits for its children; the answer is the new child run.
    """
    return run_view(await service.retry(who, run_id))
