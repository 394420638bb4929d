"""Approvals: list pending decisions, show a run's, and decide (approve, reject, edit)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from server.deps import PoolDep, PrincipalDep, ServiceDep
from server.errors import ApprovalForbiddenError
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, Approval, ApprovalList, errors
from server.runs.approvals import approval_view, get_approval, list_approvals, run_approvals

router = APIRouter(tags=["approvals"], responses=COMMON_ERRORS)

ApprovalStatus = Literal["pending", "approved", "rejected", "edited", "expired", "cancelled"]


class DecisionIn(BaseModel):
    """Body of `POST /api/approvals/{id}`."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject", "edit"]
    reason: str | None = Field(default=None, max_length=4000)
    args: dict[str, Any] | None = Field(
        default=None, description="edit only: the arguments to run the call with"
    )

    @model_validator(mode="after")
    def _check(self) -> DecisionIn:
        if self.decision == "edit" and self.args is None:
            raise ValueError("an edit needs 'args': the arguments to run the call with")
        if self.decision != "edit" and self.args is not None:
            raise ValueError("'args' is only for decision 'edit'")
        if self.decision == "reject" and not (self.reason or "").strip():
            raise ValueError("a rejection needs a 'reason'; the model reads it")
        return self


@router.get("/api/approvals", response_model=ApprovalList, responses=errors(403))
async def get_approvals(
    pool: PoolDep,
    who: PrincipalDep,
    status: Annotated[ApprovalStatus | None, Query(description="e.g. pending")] = None,
    limit: int = Query(100, ge=1, le=1000),
) -> dict[str, Any]:
    """List the tenant's approvals, oldest first (reviewers only)."""
    if not who.has_role("reviewer"):
        raise ApprovalForbiddenError("listing approvals needs the reviewer role")
    rows = await list_approvals(pool, who, status, limit)
    return {"approvals": [approval_view(r) for r in rows]}


@router.get("/api/approvals/{approval_id}", response_model=Approval, responses=errors(403, 404))
async def get_approval_route(approval_id: str, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """Return one approval."""
    return approval_view(await get_approval(pool, who, approval_id))


@router.get("/api/runs/{run_id}/approvals", response_model=ApprovalList, responses=errors(404))
async def get_run_approvals(run_id: str, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """List the run's approvals in request order."""
    rows = await run_approvals(pool, who, run_id)
    return {"approvals": [approval_view(r) for r in rows]}


@router.post(
    "/api/approvals/{approval_id}",
    response_model=Approval,
    responses={**BODY_ERRORS, **errors(403, 404, 409)},
)
async def post_decision(
    approval_id: str,
    body: Annotated[DecisionIn, CleanText],
    service: ServiceDep,
    who: PrincipalDep,
) -> dict[str, Any]:
    """Decide a pending approval; the run resumes once all its pending approvals are decided."""
    row = await service.decide(
        who, approval_id, decision=body.decision, reason=body.reason, args=body.args
    )
    return approval_view(row)
