"""The least HTTP server that keeps a durable event log: rung L2 of bench/floor.py.

`python -m bench.floor_server --port P --database-url U` serves `POST /runs`: the run (the
engine of bench/engine.py with `durability="sync"`) starts in a task of its own, so that it
outlives its client, and the answer is its events as SSE frames (`id:`/`data:` lines), each
written only after its commit to `floor_events` (bench/floor_log.py). Committed events go to
the response in-process, the cheapest delivery any server can have. No queue, worker process,
lease, tool ledger, trace or cost ledger: see the paragraph in docs/benchmarks.md.

With `--queued` it is rung L3's server instead: `POST /runs` stores the run, queued, for a
worker process (bench/floor_worker.py), and streams the events that worker commits, as their
NOTIFY payloads bring them; the run no longer lives in this process at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import uvicorn
from psycopg import AsyncConnection
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.engine import THREAD_PREFIX, engine
from bench.floor_log import CREATED, TERMINAL, Pool, durable_run, event_pool
from bench.floor_worker import EVENTS_CHANNEL, accept, create_schema
from server import loops
from server.db.checkpoint import InlinePostgresSaver
from server.ids import new_id

FAILED = b"event: run.failed\ndata: {}\n\n"


def frames(first: int, batch: list[str]) -> bytes:
    """SSE frames for a committed batch whose first event has seq `first`."""
    out = []
    for seq, data in enumerate(batch, first):
        kind = "event: run.completed\n" if data == TERMINAL else ""
        out.append(f"id: {seq}\n{kind}data: {data}\n\n")
    return "".join(out).encode()


class Relay:
    """Hand each run's committed events, as their notifications bring them, to its stream.

    Batches may arrive out of order around the run's first event, which the server sends
    itself once its commit returns: each stream puts them back in order by seq.
    """

    def __init__(self, database_url: str, pool: Pool) -> None:
        self.database_url, self.pool = database_url, pool
        self.streams: dict[str, asyncio.Queue[tuple[int, list[str]]]] = {}
        self.listening = asyncio.Event()

    async def listen(self) -> None:
        """Route every notified batch to its run's stream, if this server streams that run."""
        conn = await AsyncConnection.connect(self.database_url, autocommit=True)
        async with conn:
            await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
            self.listening.set()
            async for note in conn.notifies():
                batch = json.loads(note.payload)
                queue = self.streams.get(batch["run"])
                if queue is None:
                    continue
                if "events" in batch:
                    queue.put_nowait((batch["first"], [json.dumps(e) for e in batch["events"]]))
                else:  # too long for a payload: read it back
                    queue.put_nowait((batch["first"], await self._read(batch)))

    async def _read(self, batch: dict[str, Any]) -> list[str]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT data::text AS d FROM floor_events WHERE run_id = %s"
                " AND seq BETWEEN %s AND %s ORDER BY seq",
                (batch["run"], batch["first"], batch["last"]),
            )
            return [r["d"] for r in await cur.fetchall()]

    async def stream(self, run_id: str) -> AsyncIterator[bytes]:
        """Store the run, then yield its frames in seq order up to the terminal event."""
        queue: asyncio.Queue[tuple[int, list[str]]] = asyncio.Queue()
        self.streams[run_id] = queue
        try:
            await accept(self.pool, run_id)
            queue.put_nowait((1, [CREATED]))
            expected, held = 1, {}
            while True:
                first, batch = await queue.get()
                held[first] = batch
                while expected in held:
                    batch = held.pop(expected)
                    yield frames(expected, batch)
                    expected += len(batch)
                    if batch[-1] == TERMINAL:
                        return
        finally:
            del self.streams[run_id]


Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]


def _runs_app(lifespan: Lifespan, start: Callable[[Request], AsyncIterator[bytes]]) -> Starlette:
    """`POST /runs` answers `start(request)`'s frames as SSE; `GET /readyz`."""

    async def create_run(request: Request) -> Response:
        try:
            json.loads(await request.body() or b"{}")
        except ValueError:
            return JSONResponse(
                {"error": {"code": "invalid_json", "message": "The body must be JSON."}}, 400
            )
        return StreamingResponse(start(request), media_type="text/event-stream")

    async def ready(_: Request) -> Response:
        return JSONResponse({"ready": True})

    routes = [Route("/runs", create_run, methods=["POST"]), Route("/readyz", ready)]
    return Starlette(routes=routes, lifespan=lifespan)


def build_queued_app(database_url: str) -> Starlette:
    """Rung L3's app: runs are queued for a worker process; `POST /runs`, `GET /readyz`."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with event_pool(database_url) as pool:
            await create_schema(pool)
            relay = Relay(database_url, pool)
            listener = asyncio.create_task(relay.listen())
            await relay.listening.wait()
            app.state.relay = relay
            yield
            listener.cancel()

    def start(request: Request) -> AsyncIterator[bytes]:
        return cast(AsyncIterator[bytes], request.app.state.relay.stream(new_id(THREAD_PREFIX)))

    return _runs_app(lifespan, start)


def build_app(database_url: str) -> Starlette:
    """The app: `POST /runs` (an SSE answer) and `GET /readyz`."""
    tasks: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            engine(database_url, saver=InlinePostgresSaver) as eng,
            event_pool(database_url) as pool,
        ):
            eng.durability = "sync"
            app.state.engine, app.state.pool = eng, pool
            yield

    def start(request: Request) -> AsyncIterator[bytes]:
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

        return body()

    return _runs_app(lifespan, start)


def main() -> None:
    """Serve until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--queued", action="store_true", help="rung L3: runs go to a worker")
    args = parser.parse_args()
    build = build_queued_app if args.queued else build_app
    # The same server settings as `agentrt serve`: uvicorn's defaults (uvloop and httptools
    # when installed, as they are with agentrt), no logging config.
    config = uvicorn.Config(
        build(args.database_url),
        loop=loops.resolve_loop("auto"),
        http=loops.http_parser(),
        host="127.0.0.1",
        port=args.port,
        log_config=None,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
