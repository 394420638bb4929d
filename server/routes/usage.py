"""Usage and cost: a run's per-call breakdown, daily aggregates, models and their circuits."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from server.deps import ModelsDep, PoolDep, PrincipalDep, SettingsDep, SubagentDep
from server.errors import ForbiddenError, InvalidRequestError
from server.routes.schemas import COMMON_ERRORS, Circuits, ModelsView, RunUsage, UsageReport, errors
from server.runs.records import get_run
from server.timestamps import IsoDate
from server.usage.budgets import run_budget
from server.usage.ledger import GroupBy, daily_usage, run_calls

router = APIRouter(tags=["usage"], responses=COMMON_ERRORS)

MAX_DAYS = 366


@router.get("/api/runs/{run_id}/usage", response_model=RunUsage, responses=errors(404))
async def get_run_usage(
    run_id: str, pool: PoolDep, settings: SettingsDep, who: PrincipalDep, subagents: SubagentDep
) -> dict[str, Any]:
    """Return the run's totals, budget and one row per model call (every attempt).

    `withDescendants` adds the totals of its child runs (subagents), and theirs.
    """
    async with pool.connection() as conn:
        run = await get_run(conn, who, run_id)
        calls = await run_calls(conn, run_id)
    return {
        "withDescendants": await subagents.usage(who, run_id),
        "runId": run_id,
        "status": run.status.value,
        "totals": run.usage,
        "budget": run_budget(run.options, settings).to_json(),
        "calls": calls,
    }


@router.get("/api/usage", response_model=UsageReport, responses=errors(403))
async def get_usage(
    pool: PoolDep,
    who: PrincipalDep,
    start: Annotated[IsoDate | None, Query(alias="from", description="First UTC day.")] = None,
    end: Annotated[IsoDate | None, Query(alias="to", description="Last UTC day, included.")] = None,
    group_by: Annotated[GroupBy, Query(alias="groupBy")] = "tenant",
    user_id: Annotated[str | None, Query(alias="userId")] = None,
) -> dict[str, Any]:
    """Aggregate the tenant's model usage and cost per UTC day, for the tenant or per user.

    The default window is the last 30 days up to today. Callers without the `billing` role
    (admins have every role) see only their own usage.
    """
    end = end or datetime.now(UTC).date()
    # The first day the calendar has when `to` is within 30 days of it.
    start = start or date.fromordinal(max(end.toordinal() - 29, 1))
    if start > end:
        raise InvalidRequestError(f"'from' ({start}) is after 'to' ({end})")
    if (end - start).days >= MAX_DAYS:
        raise InvalidRequestError(f"at most {MAX_DAYS} days per request")
    if not who.has_role("billing"):
        if user_id not in (None, who.user_id):
            raise ForbiddenError("only the billing role can see other users' usage")
        user_id = who.user_id
    async with pool.connection() as conn:
        days = await daily_usage(conn, who.tenant_id, start, end, group_by, user_id)
    return {
        "tenantId": who.tenant_id,
        "from": start.isoformat(),
        "to": end.isoformat(),
        "groupBy": group_by,
        "userId": user_id,
        "days": days,
    }


@router.get("/api/models", response_model=ModelsView)
async def get_models(models: ModelsDep, who: PrincipalDep) -> dict[str, Any]:
    """Say which providers, fallbacks and routing rules this server has (never keys)."""
    return dict(models.describe())


@router.get("/api/models/circuits", response_model=Circuits)
async def get_circuits(models: ModelsDep, who: PrincipalDep) -> dict[str, Any]:
    """Return the circuit breaker of every model this process has called."""
    breakers = models.breakers
    return {
        "threshold": breakers.threshold,
        "cooldownS": breakers.cooldown_s,
        "circuits": breakers.snapshot(),
    }
