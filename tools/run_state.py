"""What a tool may read of the run's graph state: the plan and the skills loaded so far.

`dispatch_tools` sets the view for the tool calls of one model turn (a context variable, as
LangGraph's own `get_runtime()` and `get_store()` are); the tools that change that state
(`update_plan`, `load_skill`) take the view's lock, so that calls of one turn apply in turn.
The node then derives the new state from the recorded results, never from the view.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from langchain_core.tools import ToolException


@dataclass
class RunStateView:
    """The run's plan and loaded skills as the current turn's tools see them.

    Attributes:
        run_id: The run.
        plan: Its plan (None before one is made).
        skills: The skills it loaded, by name (version, hash, allowed tools...).
        options: The profile's section options (`skills`, `plan`).
    """

    run_id: str
    plan: dict[str, Any] | None = None
    skills: dict[str, dict[str, Any]] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, compare=False, repr=False)


_VIEW: ContextVar[RunStateView | None] = ContextVar("agentrt_run_state", default=None)


@contextmanager
def viewing(view: RunStateView) -> Iterator[RunStateView]:
    """Make `view` what the tools called inside this block read."""
    token = _VIEW.set(view)
    try:
        yield view
    finally:
        _VIEW.reset(token)


def current_view() -> RunStateView:
    """Return the current run's view, or refuse plainly outside an agent run."""
    view = _VIEW.get()
    if view is None:
        raise ToolException("this tool runs only inside an agent run")
    return view
