"""Runs: record, snapshot, event stream, cancel, pause and resume."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query

from server.deps import (
    PoolDep,
    PrincipalDep,
    RunStreamsDep,
    ServiceDep,
    SubagentDep,
)
from server.domain import MAX_SEQ, RunStatus, parse_seq
from server.errors import BadRequestError, EventsExpiredError
from server.events.snapshot import output_text
from server.routes.schemas import (
    COMMON_ERRORS,
    CancelledRun,
    EventStreamResponse,
    PausedRun,
    Run,
    RunPage,
    Snapshot,
    errors,
    event_stream_response,
)
from server.runs.pages import runs_page
from server.runs.pausing import request_pause, request_resume
from server.runs.records import get_run
from server.runs.views import run_view

router = APIRouter(prefix="/api/runs", tags=["runs"], responses=COMMON_ERRORS)


@router.get("", response_model=RunPage)
async def get_runs(
    pool: PoolDep,
    who: PrincipalDep,
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, description="The `nextCursor` of the previous page."),
) -> dict[str, Any]:
    """List the tenant's runs, newest first, a page at a time."""
    rows, next_cursor = await runs_page(pool, who, None, cursor, limit)
    return {"runs": [run_view(r) for r in rows], "nextCursor": next_cursor}


@router.get("/{run_id}", response_model=Run, responses=errors(404))
async def get_run_route(run_id: str, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """Return the run record."""
    async with pool.connection() as conn:
        return run_view(await get_run(conn, who, run_id))


@router.get("/{run_id}/snapshot", response_model=Snapshot, responses=errors(404))
async def get_snapshot(run_id: str, subagents: SubagentDep, who: PrincipalDep) -> dict[str, Any]:
    """Return what the run looks like now, as of `lastEventId` (children: their live status)."""
    head, children = await subagents.snapshot(who, run_id)
    snap = head.snapshot
    return {**snap, "status": head.status, "output": output_text(snap), "children": children}


def _cursor(header: str, after: int | None) -> int:
    """Return `after`, else the header's seq; a header that is no seq is refused either way."""
    seq = parse_seq(header) if header else 0
    if seq is None:
        raise BadRequestError(
            f"Last-Event-ID must be an event seq (an integer up to {MAX_SEQ}), got {header!r}"
        )
    return seq if after is None else after


@router.get(
    "/{run_id}/events",
    response_class=EventStreamResponse,
    responses={200: event_stream_response(), **errors(400, 404, 410)},
)
async def get_events(
    run_id: str,
    streams: RunStreamsDep,
    who: PrincipalDep,
    after: int | None = Query(
        None, ge=0, le=MAX_SEQ, description="Replay events with seq > after."
    ),
    last_event_id: Annotated[
        str,
        Header(
            description="The last event's seq the client has (when `after` is not given).",
            json_schema_extra={"pattern": "^[0-9]*$"},
        ),
    ] = "",
) -> EventStreamResponse:
    """Stream the run's events as SSE: replay after the cursor, then live, until the end."""
    cursor = _cursor(last_event_id, after)
    async with streams.pool.connection() as conn:
        run = await get_run(conn, who, run_id)
    if run.events_expired_at is not None:
        raise EventsExpiredError(run_id, run.events_expired_at.date().isoformat())
    return EventStreamResponse(streams.open(run_id, cursor))


@router.post(
    "/{run_id}/cancel", status_code=202, response_model=CancelledRun, responses=errors(404, 409)
)
async def cancel_run(run_id: str, service: ServiceDep, who: PrincipalDep) -> dict[str, Any]:
    """Cancel the run: at once if queued or waiting, else at the worker's next safe point."""
    run = await service.cancel(who, run_id)
    view = run_view(run)
    view["cancelled"] = run.status == RunStatus.CANCELLED
    return view


@router.post(
    "/{run_id}/pause", status_code=202, response_model=PausedRun, responses=errors(403, 404, 409)
)
async def pause_run(run_id: str, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """Pause the run: at once if queued or waiting, else at the worker's next step boundary.

    Only the run's owner or a tenant admin may pause it. `paused` says whether it took effect.
    """
    run = await request_pause(pool, who, run_id)
    view = run_view(run)
    view["paused"] = run.status == RunStatus.PAUSED
    return view


@router.post("/{run_id}/resume", response_model=Run, responses=errors(403, 404, 409))
async def resume_run(run_id: str, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """Resume a paused run from its last checkpoint (queued, or waiting_user for approvals)."""
    return run_view(await request_resume(pool, who, run_id))
