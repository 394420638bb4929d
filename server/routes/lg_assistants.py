"""LangGraph API: assistants, one per graph of langgraph.json (docs/langgraph.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from server.deps import LangGraphDep
from server.langgraph_api.assistants import (
    assistant_view,
    drawing,
    resolve_assistant,
    schemas,
    search_assistants,
    subgraphs,
)

router = APIRouter(tags=["langgraph: assistants"])
JsonBody = Annotated[dict[str, Any], Body(default_factory=dict)]


@router.post("/assistants/search")
async def search(lg: LangGraphDep, body: JsonBody, response: Response) -> list[dict[str, Any]]:
    """Search assistants by `graph_id`, `name` and `metadata`."""
    found = search_assistants(lg.graphs, body)
    offset, limit = int(body.get("offset") or 0), int(body.get("limit") or 10)
    if offset + limit < len(found):
        response.headers["X-Pagination-Next"] = str(offset + limit)
    return found[offset : offset + limit]


@router.post("/assistants/count")
async def count(lg: LangGraphDep, body: JsonBody) -> int:
    """Count the assistants a search would return."""
    return len(search_assistants(lg.graphs, body))


@router.get("/assistants/{assistant_id}")
async def get(lg: LangGraphDep, assistant_id: str) -> dict[str, Any]:
    """Return an assistant by its id or its graph id."""
    return assistant_view(resolve_assistant(lg.graphs, assistant_id))


@router.get("/assistants/{assistant_id}/graph")
async def graph(lg: LangGraphDep, assistant_id: str, xray: bool = False) -> dict[str, Any]:
    """Return the assistant's graph: its nodes and edges."""
    return await drawing(lg.graphs, assistant_id, xray)


@router.get("/assistants/{assistant_id}/schemas")
async def get_schemas(lg: LangGraphDep, assistant_id: str) -> dict[str, Any]:
    """Return the graph's input, output, state and context schemas."""
    return await schemas(lg.graphs, assistant_id)


@router.get("/assistants/{assistant_id}/subgraphs")
async def get_subgraphs(
    lg: LangGraphDep, assistant_id: str, recurse: bool = False
) -> dict[str, Any]:
    """Return the schemas of the graph's subgraphs by namespace."""
    return await subgraphs(lg.graphs, assistant_id, recurse)
