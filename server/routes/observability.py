"""Traces of runs and Prometheus metrics."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import PlainTextResponse, Response

from server.auth import CurrentPrincipal, Principal
from server.observability.traces import load_payload, load_trace
from server.routes.admin import require_admin
from server.routes.schemas import COMMON_ERRORS, Trace, errors
from server.runs.records import get_run

router = APIRouter(tags=["observability"], responses=COMMON_ERRORS)


@router.get("/api/runs/{run_id}/trace", response_model=Trace, responses=errors(404))
async def get_trace(
    request: Request, run_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """Return the run's span tree with timings, cut inputs/outputs and the failing span."""
    runtime = request.app.state.runtime
    await runtime.tracing.sink.flush()  # spans this process has not written yet
    async with runtime.pool.connection() as conn:
        run = await get_run(conn, who, run_id)
        return await load_trace(conn, run)


@router.get(
    "/api/runs/{run_id}/trace/spans/{span_id}/{kind}",
    response_model=dict[str, Any],
    responses=errors(404),
)
async def get_payload(
    request: Request,
    run_id: str,
    span_id: str,
    kind: Literal["input", "output"],
    who: Principal = CurrentPrincipal,
) -> dict[str, Any]:
    """Return the full input or output of one span (the trace carries cut copies)."""
    async with request.app.state.pool.connection() as conn:
        await get_run(conn, who, run_id)
        payload = await load_payload(conn, run_id, span_id, kind)
    if payload is None:
        raise HTTPException(404, f"span {span_id} of run {run_id} has no stored {kind}")
    return payload


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses=errors(403),
    description="Prometheus text exposition format (role `admin`).",
)
async def metrics(request: Request, who: Principal = CurrentPrincipal) -> Response:
    """Prometheus metrics of this process, with run and queue gauges read from the database.

    An operator gets every series; a tenant admin gets its tenant's series only.
    """
    require_admin(who)
    runtime = request.app.state.runtime
    if not who.is_operator:
        body = await runtime.metrics.render_tenant(runtime.pool, who.tenant_id)
        return Response(body, media_type="text/plain; version=0.0.4")
    await runtime.metrics.refresh(runtime.pool)
    runtime.metrics.set_breakers(request.app.state.models.breakers.snapshot())
    return Response(runtime.metrics.render(), media_type="text/plain; version=0.0.4")
