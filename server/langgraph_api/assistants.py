"""Assistants of the LangGraph API: one per graph of `langgraph.json`, by default.

Each graph has the assistant LangGraph gives it (its id derived from the graph id, its name
the graph id); an assistant id or a graph id both name it. agentrt's own agent is the graph
`agent`, whose runs use the tenant's agent profiles.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from langgraph.pregel import Pregel

from server.errors import AssistantNotFoundError, UnknownReferenceError
from server.langgraph_api.graphs import GraphEntry, GraphRegistry
from server.langgraph_api.serde import to_json

_LOADED = datetime.now(UTC).isoformat()


def resolve_assistant(graphs: GraphRegistry, assistant_id: str) -> GraphEntry:
    """Return the graph an assistant id (or a graph id) names.

    Raises:
        AssistantNotFoundError: it names neither.
    """
    entry = graphs.get(assistant_id)
    if entry is not None:
        return entry
    for entry in graphs.entries.values():
        if entry.assistant_id == assistant_id:
            return entry
    raise AssistantNotFoundError(assistant_id)


def resolve_named(graphs: GraphRegistry, assistant_id: str) -> GraphEntry:
    """`resolve_assistant` for a graph or assistant id a request body names.

    Raises:
        UnknownReferenceError: it names neither (422: the path's resource exists; a 404
            would read as that resource being gone).
    """
    try:
        return resolve_assistant(graphs, assistant_id)
    except AssistantNotFoundError as exc:
        raise UnknownReferenceError(str(exc)) from exc


def assistant_view(entry: GraphEntry) -> dict[str, Any]:
    """Return a graph's default assistant as LangGraph's `Assistant`."""
    return {
        "assistant_id": entry.assistant_id,
        "graph_id": entry.graph_id,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "name": entry.graph_id,
        "description": None,
        "created_at": _LOADED,
        "updated_at": _LOADED,
    }


def search_assistants(graphs: GraphRegistry, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the assistants matching `graph_id`, `name` and `metadata`, in graph order."""
    found = []
    for entry in graphs.entries.values():
        view = assistant_view(entry)
        if body.get("graph_id") and entry.graph_id != body["graph_id"]:
            continue
        if body.get("name") and str(body["name"]).lower() not in entry.graph_id.lower():
            continue
        wanted = body.get("metadata") or {}
        if any(view["metadata"].get(k) != v for k, v in wanted.items()):
            continue
        found.append(view)
    return found


async def graph_of(graphs: GraphRegistry, assistant_id: str) -> Pregel[Any]:
    """Return the compiled graph of an assistant."""
    return await graphs.compiled(resolve_assistant(graphs, assistant_id))


def _schema(read: Any) -> Any:
    try:
        return to_json(read())
    except Exception:  # a schema LangGraph cannot render (e.g. callables in the context)
        return None


async def schemas(graphs: GraphRegistry, assistant_id: str) -> dict[str, Any]:
    """Return the graph's input, output, state and context JSON schemas."""
    entry = resolve_assistant(graphs, assistant_id)
    graph = await graphs.compiled(entry)
    return {
        "graph_id": entry.graph_id,
        "input_schema": _schema(graph.get_input_jsonschema),
        "output_schema": _schema(graph.get_output_jsonschema),
        "state_schema": _schema(lambda: graph.get_input_jsonschema()),
        "config_schema": _schema(graph.get_config_jsonschema),
        "context_schema": _schema(graph.get_context_jsonschema),
    }


async def drawing(graphs: GraphRegistry, assistant_id: str, xray: bool) -> dict[str, Any]:
    """Return the graph's nodes and edges as LangGraph draws them."""
    graph = await graph_of(graphs, assistant_id)
    drawn = await graph.aget_graph(xray=xray)
    return dict(to_json(drawn.to_json()))


async def subgraphs(graphs: GraphRegistry, assistant_id: str, recurse: bool) -> dict[str, Any]:
    """Return the schemas of the graph's subgraphs by namespace."""
    graph = await graph_of(graphs, assistant_id)
    found = {}
    async for ns, sub in graph.aget_subgraphs(recurse=recurse):
        found[ns] = {
            "graph_id": ns,
            "input_schema": _schema(sub.get_input_jsonschema),
            "output_schema": _schema(sub.get_output_jsonschema),
        }
    return found
