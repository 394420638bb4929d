"""A real `agentrt serve` process, for tests of faults the whole process must survive."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import httpx

from tests.support.live import free_port
from tests.support.processes import ROOT


@contextlib.asynccontextmanager
async def api_server(
    env: dict[str, str], *, workers: bool = False, limit_s: float = 240
) -> AsyncIterator[str]:
    """Start `agentrt serve` on a free port; yield its base URL once `/healthz` answers.

    The output is kept and printed when the block fails, to show why.
    """
    port = free_port()
    args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server.cli",
        *args,
        *([] if workers else ["--no-workers"]),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            output.append(raw.decode(errors="replace").rstrip())

    reader = asyncio.create_task(read())
    base = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(limit_s), httpx.AsyncClient(base_url=base) as client:
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"agentrt serve exited with {proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield base
    except BaseException:
        print("\n".join(output[-80:]))
        raise
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await asyncio.gather(reader, return_exceptions=True)
