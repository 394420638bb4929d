"""A tool for subagent tests: wait until a file exists, so a test decides when a child ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tools.spec import agent_tool


@agent_tool(timeout_s=300)
async def wait_for_file(path: str) -> str:
    """Wait until the file at `path` exists, then return its text.

    Args:
        path: The file to wait for.
    """
    target = Path(path)
    # Another process writes the file: no event announces it.
    while not await asyncio.to_thread(target.exists):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return await asyncio.to_thread(target.read_text)
