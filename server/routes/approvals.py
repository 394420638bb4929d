"""Approvals: list pending decisions, show a run's, and decide (approve, reject, edit)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from server.auth import CurrentPrincipal, Principal
from server.errors import ApprovalForbiddenError
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, Approval, ApprovalList, errors
from server.runs.approvals import approval_view, decide, get_approval, list_approvals, run_approvals
from server.runs.toolbox import principal_toolbox
from tools.errors import ToolCallError
from tools.validation import validate_args

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
    request: Request,
    status: Annotated[ApprovalStatus | None, Query(description="e.g. pending")] = None,
    limit: int = Query(100, ge=1, le=1000),
    who: Principal = CurrentPrincipal,
) -> dict[str, Any]:
    """List the tenant's approvals, oldest first (reviewers only)."""
    if not who.has_role("reviewer"):
        raise ApprovalForbiddenError("listing approvals needs the reviewer role")
    rows = await list_approvals(request.app.state.pool, who, status, limit)
    return {"approvals": [approval_view(r) for r in rows]}


@router.get("/api/approvals/{approval_id}", response_model=Approval, responses=errors(403, 404))
async def get_approval_route(
    request: Request, approval_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """Return one approval."""
    return approval_view(await get_approval(request.app.state.pool, who, approval_id))


@router.get("/api/runs/{run_id}/approvals", response_model=ApprovalList, responses=errors(404))
async def get_run_approvals(
    request: Request, run_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """List the run's approvals in request order."""
    rows = await run_approvals(request.app.state.pool, who, run_id)
    return {"approvals": [approval_view(r) for r in rows]}


@router.post(
    "/api/approvals/{approval_id}",
    response_model=Approval,
    responses={**BODY_ERRORS, **errors(403, 404, 409)},
)
async def post_decision(
    request: Request,
    approval_id: str,
    body: Annotated[DecisionIn, CleanText],
    who: Principal = CurrentPrincipal,
) -> dict[str, Any]:
    """Decide a pending approval; the run resumes once all its pending approvals are decided."""
    pool = request.app.state.pool

    async def check_args(row: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        toolbox = await principal_toolbox(request.app.state.tools, pool, who)
        spec = toolbox.specs.get(row["tool_name"])
        if spec is None:
            raise HTTPException(422, f"tool {row['tool_name']} is no longer available")
        try:
            return validate_args(spec, args)
        except ToolCallError as exc:
            raise HTTPException(422, exc.message) from exc

    row = await decide(
        pool,
        who,
        approval_id,
        decision=body.decision,
        reason=body.reason,
        args=body.args,
        check_args=check_args,
    )
    runtime = request.app.state.runtime
    waited = (row["decided_at"] - row["requested_at"]).total_seconds()
    runtime.metrics.approval_wait.observe(waited)
    runtime.tracing.record_span(
        row["run_id"],
        "approval.wait",
        row["requested_at"],
        row["decided_at"],
        {
            "agentrt.kind": "approval",
            "agentrt.tenant_id": row["tenant_id"],
            "agentrt.conversation_id": row["conversation_id"],
            "agentrt.tool.name": row["tool_name"],
            "agentrt.approval.status": row["status"],
            "agentrt.approval.by": row["decided_by"],
        },
    )
    return approval_view(row)
