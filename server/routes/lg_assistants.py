"""LangGraph API: assistants, each graph's default and those created (docs/langgraph.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from server.deps import LangGraphDep
from server.langgraph_api.assistants import drawing, schemas, subgraphs
from server.langgraph_api.bodies import (
    AssistantCreate,
    AssistantPatch,
    AssistantSearch,
    LatestVersion,
    VersionQuery,
)
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, errors

LANGGRAPH_ERRORS = {**COMMON_ERRORS, **BODY_ERRORS, **errors(403, 404, 409)}
router = APIRouter(tags=["langgraph: assistants"], responses=LANGGRAPH_ERRORS)


@router.post("/assistants")
async def create(
    lg: LangGraphDep, sent: Annotated[AssistantCreate, CleanText, Body()]
) -> dict[str, Any]:
    """Create an assistant of `graph_id` with its `config`, `context` and `metadata`."""
    body = sent.data()
    return await (await lg.assistants("create", body)).create(body)


@router.post("/assistants/search")
async def search(
    lg: LangGraphDep, sent: Annotated[AssistantSearch, CleanText, Body()], response: Response
) -> list[dict[str, Any]]:
    """Search assistants by `graph_id`, `name` and `metadata`."""
    body = sent.data()
    found = await (await lg.assistants("search", body)).search(body)
    offset, limit = int(body.get("offset") or 0), int(body.get("limit") or 10)
    if offset + limit < len(found):
        response.headers["X-Pagination-Next"] = str(offset + limit)
    return found[offset : offset + limit]


@router.post("/assistants/count")
async def count(lg: LangGraphDep, sent: Annotated[AssistantSearch, CleanText, Body()]) -> int:
    """Count the assistants a search would return."""
    body = sent.data()
    return len(await (await lg.assistants("search", body)).search(body))


@router.get("/assistants/{assistant_id}")
async def get(lg: LangGraphDep, assistant_id: str) -> dict[str, Any]:
    """Return an assistant by its id, or a graph's default by the graph id."""
    return (await (await lg.assistants("read")).get(assistant_id))[0]


@router.patch("/assistants/{assistant_id}")
async def update(
    lg: LangGraphDep, assistant_id: str, sent: Annotated[AssistantPatch, CleanText, Body()]
) -> dict[str, Any]:
    """Store a new version of the assistant and use it."""
    body = sent.data()
    return await (await lg.assistants("update", body)).update(assistant_id, body)


@router.delete("/assistants/{assistant_id}", status_code=204)
async def delete(lg: LangGraphDep, assistant_id: str) -> Response:
    """Delete an assistant and its versions."""
    await (await lg.assistants("delete")).delete(assistant_id)
    return Response(status_code=204)


@router.post("/assistants/{assistant_id}/versions")
async def versions(
    lg: LangGraphDep, assistant_id: str, sent: Annotated[VersionQuery, CleanText, Body()]
) -> list[dict[str, Any]]:
    """List the assistant's versions, newest first."""
    body = sent.data()
    return await (await lg.assistants("search", body)).versions(assistant_id, body)


@router.post("/assistants/{assistant_id}/latest")
async def latest(
    lg: LangGraphDep, assistant_id: str, sent: Annotated[LatestVersion, CleanText, Body()]
) -> dict[str, Any]:
    """Use `version` of the assistant."""
    body = sent.data()
    book = await lg.assistants("update", body)
    return await book.set_latest(assistant_id, int(body.get("version") or 0))


@router.get("/assistants/{assistant_id}/graph")
async def graph(lg: LangGraphDep, assistant_id: str, xray: bool = False) -> dict[str, Any]:
    """Return the assistant's graph: its nodes and edges."""
    _, entry = await (await lg.assistants("read")).get(assistant_id)
    return await drawing(lg.graphs, entry.graph_id, xray)


@router.get("/assistants/{assistant_id}/schemas")
async def get_schemas(lg: LangGraphDep, assistant_id: str) -> dict[str, Any]:
    """Return the graph's input, output, state and context schemas."""
    _, entry = await (await lg.assistants("read")).get(assistant_id)
    return await schemas(lg.graphs, entry.graph_id)


@router.get("/assistants/{assistant_id}/subgraphs")
async def get_subgraphs(
    lg: LangGraphDep, assistant_id: str, recurse: bool = False
) -> dict[str, Any]:
    """Return the schemas of the graph's subgraphs by namespace."""
    _, entry = await (await lg.assistants("read")).get(assistant_id)
    return await subgraphs(lg.graphs, entry.graph_id, recurse)
