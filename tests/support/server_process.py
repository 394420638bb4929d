"""A real `agentrt serve` process (API and workers in one process) for process-level tests."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from tests.support.live import free_port
from tests.support.processes import ROOT


@contextlib.asynccontextmanager
async def server_process(
    env: dict[str, str], log: Path, limit_s: float = 120
) -> AsyncIterator[str]:
    """Start `python -m server.cli serve` on a free port; yield its base URL once it is ready.

    Its output goes to `log` (quoted when it fails to start); it is killed at the end.
    """
    port = free_port()
    output = log.open("wb")
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
        stdout=output,
        stderr=asyncio.subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(limit_s), httpx.AsyncClient(base_url=url, timeout=5) as c:
            while True:
                if proc.returncode is not None:
                    tail = log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"agentrt serve exited ({proc.returncode}):\n{tail}")
                with contextlib.suppress(httpx.TransportError):
                    if (await c.get("/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.2)
        yield url
    except TimeoutError:
        tail = log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"agentrt serve was not ready in {limit_s:g} s:\n{tail}") from None
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(proc.wait(), 30)
        output.close()
