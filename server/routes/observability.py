"""Traces of runs and Prometheus metrics."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from server.auth import require_admin
from server.deps import MetricsDep, ModelsDep, PoolDep, PrincipalDep, ServiceDep
from server.errors import NotFoundError
from server.observability.traces import load_payload
from server.routes.schemas import COMMON_ERRORS, Trace, errors
from server.runs.records import get_run

router = APIRouter(tags=["observability"], responses=COMMON_ERRORS)


@router.get("/api/runs/{run_id}/trace", response_model=Trace, responses=errors(404))
async def get_trace(run_id: str, service: ServiceDep, who: PrincipalDep) -> dict[str, Any]:
    """Return the run's span tree with timings, cut inputs/outputs and the failing span."""
    return await service.trace(who, run_id)


@router.get(
    "/api/runs/{run_id}/trace/spans/{span_id}/{kind}",
    response_model=dict[str, Any],
    responses=errors(404),
)
async def get_payload(
    run_id: str,
    span_id: str,
    kind: Literal["input", "output"],
    pool: PoolDep,
    who: PrincipalDep,
) -> dict[str, Any]:
    """Return the full input or output of one span (the trace carries cut copies)."""
    async with pool.connection() as conn:
        await get_run(conn, who, run_id)
        payload = await load_payload(conn, run_id, span_id, kind)
    if payload is None:
        raise NotFoundError(f"span {span_id} of run {run_id} has no stored {kind}")
    return payload


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses=errors(403),
    description="Prometheus text exposition format (role `admin`).",
)
async def metrics(
    pool: PoolDep, metrics: MetricsDep, models: ModelsDep, who: PrincipalDep
) -> Response:
    """Prometheus metrics of this process, with run and queue gauges read from the database.

    An operator gets every series; a tenant admin gets its tenant's series only.
    """
    require_admin(who)
    tenant = None if who.is_operator else who.tenant_id
    body = await metrics.scrape(pool, tenant, models.breakers.snapshot())
    return Response(body, media_type="text/plain; version=0.0.4")
