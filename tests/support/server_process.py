"""A real `agentrt serve` process (API and workers in one process) for process-level tests."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import httpx

from tests.support.live import free_port
from tests.support.processes import ROOT


@contextlib.asynccontextmanager
async def server_process(env: dict[str, str], limit_s: float = 90) -> AsyncIterator[str]:
    """Start `python -m server.cli serve` on a free port; yield its base URL once it answers.

    The process is killed at the end; its output is printed if it fails to start.
    """
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(limit_s), httpx.AsyncClient(base_url=url, timeout=5) as c:
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"agentrt serve exited with code {proc.returncode}")
                with contextlib.suppress(httpx.TransportError):
                    if (await c.get("/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.2)
        yield url
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(proc.wait(), 30)
