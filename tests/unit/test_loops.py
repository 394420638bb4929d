"""The processes' event loop: uvloop where installed, asyncio's when asked or where it is not."""

from __future__ import annotations

import asyncio

import pytest

from server import loops
from server.errors import StartupError


def test_auto_takes_uvloop_where_it_is_installed_and_asyncio_where_not() -> None:
    assert loops.resolve_loop("auto", installed=True) == "uvloop"
    assert loops.resolve_loop("auto", installed=False) == "asyncio"
    assert loops.resolve_loop("asyncio", installed=True) == "asyncio"
    assert loops.resolve_loop("uvloop", installed=True) == "uvloop"


def test_asking_for_uvloop_where_it_is_not_installed_says_what_to_set() -> None:
    with pytest.raises(StartupError, match="AGENTRT_EVENT_LOOP=auto or asyncio"):
        loops.resolve_loop("uvloop", installed=False)


def test_this_installation_runs_on_uvloop_and_httptools() -> None:
    """Both are dependencies here (Linux and macOS): `auto` must find them."""
    assert loops.resolve_loop("auto") == "uvloop"
    assert loops.http_parser() == "httptools"

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert loops.run(which(), "auto").startswith("uvloop")
    assert loops.run(which(), "asyncio").startswith("asyncio")
