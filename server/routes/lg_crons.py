"""LangGraph API: crons, run by the workers on their schedule (docs/langgraph.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from server.deps import LangGraphDep

router = APIRouter(tags=["langgraph: crons"])
JsonBody = Annotated[dict[str, Any], Body(default_factory=dict)]


@router.post("/runs/crons")
async def create(lg: LangGraphDep, body: JsonBody) -> dict[str, Any]:
    """Create a cron whose every firing runs on a new thread."""
    return await (await lg.crons("create", body)).create(None, body)


@router.post("/threads/{thread_id}/runs/crons")
async def create_for_thread(lg: LangGraphDep, thread_id: str, body: JsonBody) -> dict[str, Any]:
    """Create a cron that runs on the thread."""
    return await (await lg.crons("create", body)).create(thread_id, body)


@router.post("/runs/crons/search")
async def search(lg: LangGraphDep, body: JsonBody) -> list[dict[str, Any]]:
    """Search the tenant's crons by `assistant_id` and `thread_id`."""
    found: list[dict[str, Any]] = await (await lg.crons("search", body)).search(body)
    return found


@router.post("/runs/crons/count")
async def count(lg: LangGraphDep, body: JsonBody) -> int:
    """Count the crons a search would return."""
    found: int = await (await lg.crons("search", body)).search(body, count=True)
    return found


@router.patch("/runs/crons/{cron_id}")
async def update(lg: LangGraphDep, cron_id: str, body: JsonBody) -> dict[str, Any]:
    """Change a cron's schedule, `enabled`, `end_time` or run fields."""
    return await (await lg.crons("update", body)).update(cron_id, body)


@router.delete("/runs/crons/{cron_id}", status_code=204)
async def delete(lg: LangGraphDep, cron_id: str) -> Response:
    """Delete a cron."""
    await (await lg.crons("delete", {"cron_id": cron_id})).delete(cron_id)
    return Response(status_code=204)
