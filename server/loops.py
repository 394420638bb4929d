"""Which event loop the processes run on: uvloop where it is installed, else asyncio's.

`agentrt serve` hands the choice to uvicorn, with the `httptools` HTTP parser when that is
installed; `agentrt worker` and the other async commands run on it directly. Both are
dependencies on Linux and macOS; `AGENTRT_EVENT_LOOP=asyncio` turns uvloop off, for
a debugger or a profiler that only knows asyncio's loop (docs/decisions/2014).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from server.errors import StartupError

T = TypeVar("T")
EventLoop = Literal["auto", "asyncio", "uvloop"]


def resolve_loop(choice: EventLoop, installed: bool | None = None) -> Literal["asyncio", "uvloop"]:
    """Return the loop to run: `auto` is uvloop when it can be imported.

    `installed` says whether uvloop is; None looks.

    Raises:
        StartupError: uvloop was asked for and is not installed.
    """
    if installed is None:
        installed = importlib.util.find_spec("uvloop") is not None
    if choice == "asyncio" or (choice == "auto" and not installed):
        return "asyncio"
    if not installed:
        raise StartupError(
            "AGENTRT_EVENT_LOOP=uvloop, but uvloop is not installed (it has no build for "
            "this platform); set AGENTRT_EVENT_LOOP=auto or asyncio"
        )
    return "uvloop"


def http_parser() -> Literal["h11", "httptools"]:
    """Return uvicorn's HTTP parser: httptools (C) when installed, else h11 (pure Python)."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def run(main: Coroutine[Any, Any, T], choice: EventLoop) -> T:
    """Run `main` to its end on a new loop of the chosen kind, as `asyncio.run` does."""
    if resolve_loop(choice) == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
