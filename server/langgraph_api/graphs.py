"""The graphs of `langgraph.json`, loaded at start-up and compiled for the durable runtime.

An entry under `graphs` names a compiled graph, a `StateGraph` builder, or a factory that
takes a `RunnableConfig` (sync or async), as LangGraph's CLI allows. Each is given agentrt's
fenced checkpointer and the memory store. The entry that points at `server/devgraph.py` is
agentrt's own agent: its runs use the server's compiled agent graph and run context.
`dependencies` (local folders) go on `sys.path` and `env` (a file or a mapping) fills
variables that are not set yet, as `langgraph dev` does.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from dotenv import dotenv_values
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.store.base import BaseStore

from server.errors import StartupError

OWN_AGENT_FILE = "server/devgraph.py"
# LangGraph derives a graph's default assistant id from this namespace and the graph id.
ASSISTANT_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")


def default_assistant_id(graph_id: str) -> str:
    """Return the id of the assistant every graph has by default."""
    return str(uuid.uuid5(ASSISTANT_NAMESPACE, graph_id))


@dataclass
class GraphEntry:
    """One graph of `langgraph.json`.

    Attributes:
        graph_id: Its key under `graphs`.
        spec: Where it is, as written (`./path.py:attr` or `module:attr`).
        own: It is agentrt's own agent (run with the server's graph and run context).
        target: The loaded compiled graph, builder or factory (None for the own agent).
    """

    graph_id: str
    spec: str
    own: bool = False
    target: Any = None

    @property
    def assistant_id(self) -> str:
        """The id of the graph's default assistant."""
        return default_assistant_id(self.graph_id)


@dataclass
class GraphRegistry:
    """The loaded graphs by id, and what every graph is compiled with."""

    entries: dict[str, GraphEntry] = field(default_factory=dict)
    checkpointer: BaseCheckpointSaver[Any] | None = None
    store: BaseStore | None = None
    own_graph: Pregel[Any, Any, Any, Any] | None = None
    # The `langgraph_sdk.Auth` object of `auth.path`, when langgraph.json names one.
    auth: Any = None

    def get(self, graph_id: str) -> GraphEntry | None:
        """Return the entry of `graph_id`, or None."""
        return self.entries.get(graph_id)

    async def compiled(
        self, entry: GraphEntry, config: RunnableConfig | None = None
    ) -> Pregel[Any, Any, Any, Any]:
        """Return the entry's graph compiled with the checkpointer and store.

        A factory is called with `config` each time, as LangGraph's server does per run.
        """
        if entry.own:
            assert self.own_graph is not None
            return self.own_graph
        target = entry.target
        if not isinstance(target, (Pregel, StateGraph)) and callable(target):
            made = target(config or {}) if _takes_argument(target) else target()
            target = await made if inspect.isawaitable(made) else made
        if isinstance(target, StateGraph):
            return target.compile(checkpointer=self.checkpointer, store=self.store)
        if isinstance(target, Pregel):
            return target.copy(update={"checkpointer": self.checkpointer, "store": self.store})
        raise StartupError(
            f"graph {entry.graph_id!r} ({entry.spec}) is neither a compiled graph, a StateGraph"
            " nor a factory returning one"
        )


def _takes_argument(target: Any) -> bool:
    try:
        return bool(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return False


def load_graphs(
    config_path: Path | None,
    *,
    checkpointer: BaseCheckpointSaver[Any] | None,
    store: BaseStore | None,
    own_graph: Pregel[Any, Any, Any, Any],
) -> GraphRegistry:
    """Load every graph of `config_path`; agentrt's own agent is there even without it.

    Raises:
        StartupError: the file is not valid, or a graph cannot be imported.
    """
    registry = GraphRegistry(checkpointer=checkpointer, store=store, own_graph=own_graph)
    config = _read_config(config_path)
    base = config_path.resolve().parent if config_path is not None else Path.cwd()
    for dependency in config.get("dependencies", []):
        folder = (base / dependency).resolve()
        if str(dependency).startswith(".") and folder.is_dir() and str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    _apply_env(config.get("env"), base)
    for graph_id, spec in (config.get("graphs") or {}).items():
        spec_text = spec if isinstance(spec, str) else str(spec.get("path", ""))
        registry.entries[graph_id] = _load_entry(graph_id, spec_text, base)
    auth_path = (config.get("auth") or {}).get("path")
    if auth_path:
        registry.auth = _load_entry("auth", str(auth_path), base).target
    if not any(e.own for e in registry.entries.values()):
        registry.entries["agent"] = GraphEntry("agent", OWN_AGENT_FILE, own=True)
    return registry


def _read_config(path: Path | None) -> dict[str, Any]:
    if path is None or not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise StartupError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise StartupError(f"{path} must hold a JSON object with a `graphs` mapping")
    return config


def _apply_env(env: Any, base: Path) -> None:
    """Set the variables of `env` that the environment does not set already."""
    values: Mapping[str, Any]
    if isinstance(env, str):
        values = dotenv_values(base / env) if (base / env).is_file() else {}
    elif isinstance(env, Mapping):
        values = env
    else:
        return
    for key, value in values.items():
        if value is not None:
            os.environ.setdefault(key, str(value))


def _load_entry(graph_id: str, spec: str, base: Path) -> GraphEntry:
    location, _, attribute = spec.rpartition(":")
    if not location or not attribute:
        raise StartupError(f"graph {graph_id!r}: {spec!r} is not `path.py:attribute`")
    is_file = location.endswith(".py") or "/" in location
    if is_file and (base / location).resolve() == (base / OWN_AGENT_FILE).resolve():
        return GraphEntry(graph_id, spec, own=True)
    try:
        module = _import_file(graph_id, base / location) if is_file else _import(location)
        target = getattr(module, attribute)
    except Exception as exc:
        raise StartupError(f"graph {graph_id!r}: cannot load {spec!r}: {exc}") from exc
    return GraphEntry(graph_id, spec, target=target)


def _import(name: str) -> ModuleType:
    return importlib.import_module(name)


def _import_file(graph_id: str, path: Path) -> ModuleType:
    name = f"agentrt_graphs.{graph_id}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
