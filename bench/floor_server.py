"""The least HTTP server that keeps a durable event log: rung L2 of bench/floor.py.

`python -m bench.floor_server --port P --database-url U` serves `POST /runs`: the run (the
engine of bench/engine.py with `durability="sync"`) starts in a task of its own, so that it
outlives its client, and the answer is its events as SSE frames (`id:`/`data:` lines), each
written only after its commit to `floor_events` (bench/floor_log.py). Committed events go to
the response in-process, the cheapest delivery any server can have. No queue, worker process,
lease, tool ledger, trace or cost ledger: see the paragraph in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.engine import engine
from bench.floor_log import TERMINAL, durable_run, event_pool

FAILED = b"event: run.failed\ndata: {}\n\n"


def frames(first: int, batch: list[str]) -> bytes:
    """SSE frames for a committed batch whose first event has seq `first`."""
    out = []
    for seq, data in enumerate(batch, first):
        kind = "event: run.completed\n" if data == TERMINAL else ""
        out.append(f"id: {seq}\n{kind}data: {data}\n\n")
    return "".join(out).encode()


def build_app(database_url: str) -> Starlette:
    """The app: `POST /runs` (an SSE answer) and `GET /readyz`."""
    tasks: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with engine(database_url) as eng, event_pool(database_url) as pool:
            eng.durability = "sync"
            app.state.engine, app.state.pool = eng, pool
            yield

    async def create_run(request: Request) -> Response:
        try:
            json.loads(await request.body() or b"{}")
        except ValueError:
            return JSONResponse(
                {"error": {"code": "invalid_json", "message": "The body must be JSON."}}, 400
            )
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def run() -> None:
            try:
                await durable_run(
                    request.app.state.engine,
                    request.app.state.pool,
                    lambda first, batch: queue.put_nowait(frames(first, batch)),
                )
            except Exception:
                traceback.print_exc()  # the server's output is the benchmark's log
                queue.put_nowait(FAILED)
            finally:
                queue.put_nowait(None)

        task = asyncio.create_task(run())
        tasks.add(task)  # a strong reference: the run outlives a client that goes away
        task.add_done_callback(tasks.discard)

        async def body() -> AsyncIterator[bytes]:
            while (chunk := await queue.get()) is not None:
                yield chunk

        return StreamingResponse(body(), media_type="text/event-stream")

    async def ready(_: Request) -> Response:
        return JSONResponse({"ready": True})

    routes = [Route("/runs", create_run, methods=["POST"]), Route("/readyz", ready)]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    """Serve until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    args = parser.parse_args()
    # The same server settings as `agentrt serve`: uvicorn's defaults, no logging config.
    config = uvicorn.Config(
        build_app(args.database_url),
        host="127.0.0.1",
        port=args.port,
        log_config=None,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
