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
    env: dict[str, str], log: Path, limit_s: float = 180
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
        try:
            await _wait_ready(proc, url, limit_s)
        except TimeoutError:
            raise AssertionError(
                f"agentrt serve not ready in {limit_s:g} s:\n{_tail(log)}"
            ) from None
        except RuntimeError as exc:
            raise AssertionError(f"{exc}:\n{_tail(log)}") from None
        yield url
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(proc.wait(), 30)
        output.close()


async def _wait_ready(proc: asyncio.subprocess.Process, url: str, limit_s: float) -> None:
    async with asyncio.timeout(limit_s), httpx.AsyncClient(base_url=url, timeout=5) as client:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"agentrt serve exited with code {proc.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.2)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]
