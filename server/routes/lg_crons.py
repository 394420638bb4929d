"""LangGraph API: crons, run by the workers on their schedule (docs/langgraph.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from server.deps import LangGraphDep
from server.langgraph_api.bodies import CronCreate, CronPatch, CronSearch
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, errors

LANGGRAPH_ERRORS = {**COMMON_ERRORS, **BODY_ERRORS, **errors(403, 404, 409)}
router = APIRouter(tags=["langgraph: crons"], responses=LANGGRAPH_ERRORS)


@router.post("/runs/crons")
async def create(
    lg: LangGraphDep, sent: Annotated[CronCreate, CleanText, Body()]
) -> dict[str, Any]:
    """Create a cron whose every firing runs on a new thread."""
    body = sent.data()
    return await (await lg.crons("create", body)).create(None, body)


@router.post("/threads/{thread_id}/runs/crons")
async def create_for_thread(
    lg: LangGraphDep, thread_id: str, sent: Annotated[CronCreate, CleanText, Body()]
) -> dict[str, Any]:
    """Create a cron that runs on the thread."""
    body = sent.data()
    return await (await lg.crons("create", body)).create(thread_id, body)


@router.post("/runs/crons/search")
async def search(
    lg: LangGraphDep, sent: Annotated[CronSearch, CleanText, Body()]
) -> list[dict[str, Any]]:
    """Search the tenant's crons by `assistant_id` and `thread_id`."""
    body = sent.data()
    found: list[dict[str, Any]] = await (await lg.crons("search", body)).search(body)
    return found


@router.post("/runs/crons/count")
async def count(lg: LangGraphDep, sent: Annotated[CronSearch, CleanText, Body()]) -> int:
    """Count the crons a search would return."""
    body = sent.data()
    found: int = await (await lg.crons("search", body)).search(body, count=True)
    return found


@router.patch("/runs/crons/{cron_id}")
async def update(
    lg: LangGraphDep, cron_id: str, sent: Annotated[CronPatch, CleanText, Body()]
) -> dict[str, Any]:
    """Change a cron's schedule, `enabled`, `end_time` or run fields."""
    body = sent.data()
    return await (await lg.crons("update", body)).update(cron_id, body)


@router.delete("/runs/crons/{cron_id}", status_code=204)
async def delete(lg: LangGraphDep, cron_id: str) -> Response:
    """Delete a cron."""
    await (await lg.crons("delete", {"cron_id": cron_id})).delete(cron_id)
    return Response(status_code=204)
