"""The web console: its static pages at `/console`, and the few reads it needs that are new.

The console is a client of the public API like any other (docs/console.md); the endpoints
here serve what it would otherwise assemble from many requests.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from server.console.service import (
    Dimension,
    RunFilter,
    events_page,
    list_runs,
    usage_breakdown,
)
from server.deps import PoolDep, PrincipalDep
from server.domain import MAX_SEQ, RunStatus
from server.routes.schemas import COMMON_ERRORS, errors
from server.timestamps import IsoTime

STATIC = Path(__file__).resolve().parent.parent / "console" / "static"

router = APIRouter(prefix="/api/console", tags=["console"], responses=COMMON_ERRORS)
pages = APIRouter(include_in_schema=False)


@pages.get("/console")
async def console_root() -> RedirectResponse:
    """Send `/console` to `/console/` so the pages' relative links resolve."""
    return RedirectResponse("/console/")


def console_files() -> StaticFiles:
    """The console's HTML, JavaScript and CSS, served as files (no build step)."""
    return StaticFiles(directory=STATIC, html=True)


@router.get("/runs", responses=errors(400, 422))
async def get_console_runs(
    pool: PoolDep,
    who: PrincipalDep,
    status: RunStatus | None = None,
    agent: Annotated[str | None, Query(max_length=200)] = None,
    user: Annotated[str | None, Query(max_length=200)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    since: IsoTime | None = None,
    until: IsoTime | None = None,
    min_cost: Annotated[Decimal | None, Query(alias="minCost", ge=0, max_digits=20)] = None,
    flag: Literal["stuck", "dead_letter"] | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    """List the tenant's runs matching the filters, newest first, with counts per status.

    `counts` apply every filter but `status`; `flags` count the stuck (unfinished, unchanged
    for five minutes) and dead-lettered runs among them. Each run carries its `flags`.
    """
    filters = RunFilter(status, agent, user, model, since, until, min_cost, flag)
    return await list_runs(pool, who, filters, cursor, limit)


@router.get("/runs/{run_id}/events", responses=errors(404, 422))
async def get_console_events(
    run_id: str,
    pool: PoolDep,
    who: PrincipalDep,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1_000,
) -> Response:
    """Return a page of the run's stored events as JSON: `events`, `nextAfter` (null at the end).

    For reading a long run a page at a time; `GET /api/runs/{id}/events` streams live ones.
    """
    body = await events_page(pool, who, run_id, after, limit)
    return Response(body, media_type="application/json")


@router.get("/usage", responses=errors(400, 422))
async def get_console_usage(
    pool: PoolDep,
    who: PrincipalDep,
    by: Dimension = "day",
    since: IsoTime | None = None,
    until: IsoTime | None = None,
) -> dict[str, Any]:
    """Return cost, tokens, model calls and runs per day, model, user or agent profile.

    The period defaults to the last 30 days. Callers without the `billing` role see their own
    usage only (`scope: "user"`).
    """
    return await usage_breakdown(pool, who, by, since, until)
