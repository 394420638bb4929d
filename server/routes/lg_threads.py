"""LangGraph API: threads, their state and history (docs/langgraph.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Response

from server.deps import LangGraphDep
from server.errors import LangGraphItemNotFoundError, UnknownReferenceError
from server.langgraph_api.bodies import (
    HistoryQuery,
    Prune,
    StateAt,
    StateUpdate,
    ThreadCreate,
    ThreadPatch,
    ThreadSearch,
)
from server.langgraph_api.threads import state_view
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, errors

LANGGRAPH_ERRORS = {**COMMON_ERRORS, **BODY_ERRORS, **errors(403, 404, 409)}
router = APIRouter(tags=["langgraph: threads"], responses=LANGGRAPH_ERRORS)


@router.post("/threads")
async def create(
    lg: LangGraphDep, sent: Annotated[ThreadCreate, CleanText, Body()]
) -> dict[str, Any]:
    """Create a thread (`thread_id`, `metadata`, `if_exists`, `ttl`, `supersteps`)."""
    body = sent.data()
    keeper = await lg.threads("create", body)
    thread = await keeper.create(
        body.get("thread_id"),
        dict(body.get("metadata") or {}),
        body.get("if_exists") or "raise",
        body.get("ttl"),
    )
    if body.get("supersteps"):
        thread = await keeper.apply_supersteps(thread["thread_id"], body["supersteps"])
    return thread


@router.post("/threads/search")
async def search(
    lg: LangGraphDep, sent: Annotated[ThreadSearch, CleanText, Body()]
) -> list[dict[str, Any]]:
    """Search the caller's threads by `metadata`, `ids` and `status`."""
    body = sent.data()
    found: list[dict[str, Any]] = await (await lg.threads("search", body)).search(body)
    return found


@router.post("/threads/count")
async def count(lg: LangGraphDep, sent: Annotated[ThreadSearch, CleanText, Body()]) -> int:
    """Count the caller's threads a search would return."""
    body = sent.data()
    found: int = await (await lg.threads("search", body)).search(body, count=True)
    return found


@router.post("/threads/prune")
async def prune(lg: LangGraphDep, sent: Annotated[Prune, CleanText, Body()]) -> dict[str, int]:
    """Delete threads, or keep only their latest checkpoint (`strategy`)."""
    body = sent.data()
    keeper = await lg.threads("delete", body)
    ids = [str(i) for i in body.get("thread_ids") or []]
    return await keeper.prune(ids, str(body.get("strategy") or "delete"))


@router.get("/threads/{thread_id}")
async def get(
    lg: LangGraphDep,
    thread_id: str,
    include: Annotated[list[Literal["ttl"]] | None, Query()] = None,
) -> dict[str, Any]:
    """Return a thread with its status, values and pending interrupts (and `ttl` if asked)."""
    keeper = await lg.threads("read")
    thread = await keeper.get(thread_id)
    if include and "ttl" in include:
        thread["ttl"] = await keeper.ttl(thread_id)
    return thread


@router.patch("/threads/{thread_id}")
async def update(
    lg: LangGraphDep, thread_id: str, sent: Annotated[ThreadPatch, CleanText, Body()]
) -> dict[str, Any]:
    """Merge `metadata` into the thread's; `ttl` sets when it is deleted."""
    body = sent.data()
    keeper = await lg.threads("update", body)
    return await keeper.update(thread_id, dict(body.get("metadata") or {}), body.get("ttl"))


@router.delete("/threads/{thread_id}", status_code=204)
async def delete(lg: LangGraphDep, thread_id: str) -> Response:
    """Delete the thread, its runs and its checkpoints."""
    await (await lg.threads("delete")).delete(thread_id)
    return Response(status_code=204)


@router.post("/threads/{thread_id}/copy")
async def copy(lg: LangGraphDep, thread_id: str) -> dict[str, Any]:
    """Copy the thread and its checkpoints to a new thread."""
    return await (await lg.threads("read")).copy(thread_id)


async def _state(
    lg: LangGraphDep, thread_id: str, checkpoint: dict[str, Any] | None, subgraphs: bool
) -> dict[str, Any]:
    keeper = await lg.threads("read")
    state = await keeper.state(thread_id, checkpoint, subgraphs=subgraphs)
    if state is None:
        empty: dict[str, Any] = {"values": {}, "next": [], "tasks": [], "interrupts": []}
        return {**empty, "checkpoint": None, "metadata": None, "created_at": None}
    return state_view(state)


@router.get("/threads/{thread_id}/state")
async def get_state(lg: LangGraphDep, thread_id: str, subgraphs: bool = False) -> dict[str, Any]:
    """Return the thread's latest state."""
    return await _state(lg, thread_id, None, subgraphs)


@router.get("/threads/{thread_id}/state/{checkpoint_id}")
async def get_state_at(
    lg: LangGraphDep, thread_id: str, checkpoint_id: str, subgraphs: bool = False
) -> dict[str, Any]:
    """Return the thread's state at a checkpoint."""
    return await _state(lg, thread_id, {"checkpoint_id": checkpoint_id}, subgraphs)


@router.post("/threads/{thread_id}/state/checkpoint")
async def post_state_at(
    lg: LangGraphDep, thread_id: str, sent: Annotated[StateAt, CleanText, Body()]
) -> dict[str, Any]:
    """Return the thread's state at `checkpoint`."""
    body = sent.data()
    try:
        return await _state(lg, thread_id, body.get("checkpoint"), bool(body.get("subgraphs")))
    except LangGraphItemNotFoundError as exc:
        # The thread exists (a missing one is ThreadNotFoundError, still 404): only the
        # checkpoint the body names is missing.
        raise UnknownReferenceError(str(exc)) from exc


@router.post("/threads/{thread_id}/state")
async def update_state(
    lg: LangGraphDep, thread_id: str, sent: Annotated[StateUpdate, CleanText, Body()]
) -> dict[str, Any]:
    """Write `values` to the thread's state as node `as_node`."""
    body = sent.data()
    return await (await lg.threads("update", body)).update_state(thread_id, body)


@router.post("/threads/{thread_id}/history")
async def history(
    lg: LangGraphDep, thread_id: str, sent: Annotated[HistoryQuery, CleanText, Body()]
) -> list[dict[str, Any]]:
    """Return the thread's states, newest first."""
    body = sent.data()
    return await (await lg.threads("read")).history(thread_id, body)


@router.get("/threads/{thread_id}/history")
async def get_history(
    lg: LangGraphDep,
    thread_id: str,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    before: str | None = None,
) -> list[dict[str, Any]]:
    """Return the thread's states, newest first."""
    return await (await lg.threads("read")).history(thread_id, {"limit": limit, "before": before})
