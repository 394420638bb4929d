"""Runs: record, snapshot, event stream, cancel."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from server.auth import CurrentPrincipal, Principal
from server.runs import RunStatus
from server.snapshot import output_text
from server.sse import event_stream
from server.store import get_run, list_runs, request_cancel, run_view

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.get("")
async def get_runs(
    request: Request,
    limit: int = Query(50, ge=1, le=500),
    who: Principal = CurrentPrincipal,
) -> dict[str, Any]:
    """List the tenant's runs, newest first."""
    rows = await list_runs(request.app.state.pool, who, limit=limit)
    return {"runs": [run_view(r) for r in rows]}


@router.get("/{run_id}")
async def get_run_route(
    request: Request, run_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """Return the run record."""
    async with request.app.state.pool.connection() as conn:
        return run_view(await get_run(conn, who, run_id))


@router.get("/{run_id}/snapshot")
async def get_snapshot(
    request: Request, run_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """Return what the run looks like now, as of `lastEventId`."""
    async with request.app.state.pool.connection() as conn:
        run = await get_run(conn, who, run_id)
    snap = run["snapshot"]
    return {**snap, "status": run["status"], "output": output_text(snap)}


def _cursor(request: Request, after: int | None) -> int:
    if after is not None:
        return after
    header = request.headers.get("last-event-id")
    if header is None or header == "":
        return 0
    if not header.isdigit():
        raise HTTPException(400, f"Last-Event-ID must be an event seq (an integer), got {header!r}")
    return int(header)


@router.get("/{run_id}/events")
async def get_events(
    request: Request,
    run_id: str,
    after: int | None = Query(None, ge=0, description="Replay events with seq > after."),
    who: Principal = CurrentPrincipal,
) -> StreamingResponse:
    """Stream the run's events as SSE: replay after the cursor, then live, until the end."""
    cursor = _cursor(request, after)
    async with request.app.state.pool.connection() as conn:
        await get_run(conn, who, run_id)
    settings = request.app.state.settings
    stream = event_stream(
        request.app.state.pool,
        request.app.state.notifier,
        request.app.state.feeds,
        run_id,
        cursor,
        heartbeat_s=settings.sse_heartbeat_s,
        page=settings.sse_replay_page,
        connections=request.app.state.runtime.metrics.sse_connections,
        stop=request.app.state.runtime.stopping,
    )
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/{run_id}/cancel", status_code=202)
async def cancel_run(
    request: Request, run_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """Cancel the run: at once if queued or waiting, else at the worker's next safe point."""
    run = await request_cancel(request.app.state.pool, who, run_id)
    view = run_view(run)
    view["cancelled"] = run["status"] == RunStatus.CANCELLED
    if view["cancelled"]:
        request.app.state.runtime.metrics.events_written.inc()  # run.cancelled, stored here
    return view
