"""LangGraph API: the store, and the server's `/ok` and `/info` (docs/langgraph.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response

from server.deps import LangGraphDep
from server.langgraph_api.bodies import NamespaceQuery, StoreDelete, StorePut, StoreSearch
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, errors

LANGGRAPH_ERRORS = {**COMMON_ERRORS, **BODY_ERRORS, **errors(403, 404, 409)}
router = APIRouter(tags=["langgraph: store"], responses=LANGGRAPH_ERRORS)


@router.put("/store/items", status_code=204)
async def put_item(lg: LangGraphDep, sent: Annotated[StorePut, CleanText, Body()]) -> Response:
    """Store an item (`namespace`, `key`, `value`, `index`, `ttl` in minutes)."""
    body = sent.data()
    await (await lg.store("put", body)).put(body)
    return Response(status_code=204)


@router.get("/store/items")
async def get_item(
    lg: LangGraphDep,
    namespace: Annotated[
        str,
        Query(
            description="The labels joined with dots.",
            json_schema_extra={"pattern": r"^[^.]+(\.[^.]+)*$"},
        ),
    ],
    key: str,
    refresh_ttl: bool | None = None,
) -> dict[str, Any]:
    """Return an item; `namespace` is dot-joined; `refresh_ttl` (default true) renews its ttl."""
    value = {"namespace": namespace.split("."), "key": key}
    gate = await lg.store("get", value)
    return await gate.get(".".join(value["namespace"]), str(value["key"]), refresh_ttl)


@router.delete("/store/items", status_code=204)
async def delete_item(
    lg: LangGraphDep, sent: Annotated[StoreDelete, CleanText, Body()]
) -> Response:
    """Delete an item."""
    body = sent.data()
    await (await lg.store("delete", body)).delete(body)
    return Response(status_code=204)


@router.post("/store/items/search")
async def search_items(
    lg: LangGraphDep, sent: Annotated[StoreSearch, CleanText, Body()]
) -> dict[str, Any]:
    """Search items under `namespace_prefix` by `filter` and `query` (semantic)."""
    body = sent.data()
    return await (await lg.store("search", body)).search(body)


@router.post("/store/namespaces")
async def namespaces(
    lg: LangGraphDep, sent: Annotated[NamespaceQuery, CleanText, Body()]
) -> dict[str, Any]:
    """List namespaces."""
    body = sent.data()
    return await (await lg.store("list_namespaces", body)).namespaces(body)


@router.get("/ok")
async def ok() -> dict[str, bool]:
    """Say the server is up."""
    return {"ok": True}


@router.get("/info")
async def info(lg: LangGraphDep) -> dict[str, Any]:
    """Describe the server to LangGraph clients."""
    return {
        "version": "agentrt",
        "flags": {"assistants": True, "crons": False, "langsmith": False},
        "graphs": sorted(lg.graphs.entries),
    }
