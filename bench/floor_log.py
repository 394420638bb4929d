"""The least a durable event log costs: each stream part committed to Postgres before delivery.

The mechanism behind "a resumed stream is gapless and exact", and nothing more: the engine's
stream parts become small events with a gapless `seq` per run, and one writer task per run
appends them to `floor_events` with a NOTIFY, batching whatever is pending while its previous
commit is in flight (one statement, so one round trip, per batch). An event counts as delivered only
after its commit; the run ends for its client when the last event is committed. Used in this
process by bench/floor.py (rung L1) and inside bench/floor_server.py (rung L2).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from bench.engine import THREAD_PREFIX, Engine
from graphs.context import RunContext
from server.db.pool import connection_kwargs
from server.events.projection import STREAM_MODES
from server.ids import new_id

TABLE = (
    "CREATE TABLE IF NOT EXISTS floor_events "
    "(run_id text, seq int, data jsonb, PRIMARY KEY (run_id, seq))"
)
# One statement per batch: the rows and the NOTIFY commit together, in one round trip, and
# the client does less work than for the same two statements pipelined. The batch goes as one
# JSON array, as agentrt's appends do: psycopg dumps a string in C, arrays element by element.
APPEND = (
    "WITH appended AS (INSERT INTO floor_events (run_id, seq, data) "
    "SELECT %s, s, d FROM jsonb_to_recordset(%s::jsonb) AS t(s int, d jsonb)) "
    "SELECT pg_notify('floor_events', %s)"
)
# A run's first event, committed before anything is delivered: a server that answers before
# the run it accepted is stored can lose it.
CREATED = json.dumps({"type": "run.created"})
TERMINAL = json.dumps({"type": "run.completed"})

Pool = AsyncConnectionPool[AsyncConnection[Any]]
# Called with the first seq of a committed batch and the batch's encoded events.
Deliver = Callable[[int, list[str]], None]


def encode(part: Any) -> str:
    """Encode one `(mode, chunk)` stream part as only what a client needs of it.

    Dumping whole message objects would cost more than the run itself; agentrt's projection
    likewise keeps a chunk's text, a step's node names and a custom event's dict.
    """
    mode, chunk = part
    if mode == "messages":
        return json.dumps({"type": "delta", "text": str(chunk[0].content)})
    if mode == "updates":
        return json.dumps({"type": "step", "nodes": list(chunk)})
    return json.dumps({"type": mode, "data": chunk if isinstance(chunk, dict) else None})


@asynccontextmanager
async def event_pool(database_url: str, max_size: int = 20) -> AsyncIterator[Pool]:
    """A pool for the event log (sized like agentrt's), with `floor_events` created."""
    pool: Pool = AsyncConnectionPool(
        database_url, min_size=4, max_size=max_size, kwargs=connection_kwargs(), open=False
    )
    await pool.open(wait=True, timeout=30)
    try:
        async with pool.connection() as conn:
            await conn.execute(TABLE)
        yield pool
    finally:
        await pool.close()


class Writer:
    """One run's writer: appends pending events in batches, one commit in flight at a time.

    `commit` is the append; bench/floor_worker.py's writer fences it.
    """

    def __init__(self, pool: Pool, run_id: str, deliver: Deliver | None) -> None:
        self.pool, self.run_id, self.deliver = pool, run_id, deliver
        self.pending: list[str] = []
        self.seq = 0
        self.commits = 0
        self.wake = asyncio.Event()
        self.closed = False

    def add(self, event: str) -> None:
        """Queue an encoded event for the next batch."""
        self.pending.append(event)
        self.wake.set()

    def close(self) -> None:
        """Queue the terminal event; `run` returns once it is committed."""
        self.add(TERMINAL)
        self.closed = True

    async def commit(self, batch: list[str]) -> None:
        """Append `batch` after the events stored so far, commit, then deliver it."""
        first = self.seq + 1
        seqs = list(range(first, first + len(batch)))
        notice = f"{self.run_id}:{seqs[-1]}"
        rows = ",".join(f'{{"s":{n},"d":{data}}}' for n, data in zip(seqs, batch, strict=True))
        async with self.pool.connection() as conn:
            await conn.execute(APPEND, (self.run_id, f"[{rows}]", notice))
        self.seq = seqs[-1]
        self.commits += 1
        if self.deliver is not None:
            self.deliver(first, batch)

    async def run(self) -> None:
        """Commit whatever is pending, a batch at a time, until the terminal event is in."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.pending:
                batch, self.pending = self.pending, []
                await self.commit(batch)
            if self.closed and not self.pending:
                return


async def durable_run(eng: Engine, pool: Pool, deliver: Deliver | None = None) -> tuple[int, int]:
    """Run one turn of `eng`'s graph with every stream part committed.

    Returns the number of events the run logged and the number of commits that took.

    The graph input, config and context are those of `Engine.run`, with `durability="sync"`.
    `deliver` receives each batch after its commit: first the run's `run.created` alone,
    committed before the graph starts; the last batch holds the terminal event.
    """
    run_id = new_id(THREAD_PREFIX)
    writer = Writer(pool, run_id, deliver)
    await writer.commit([CREATED])
    task = asyncio.create_task(writer.run())
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    context = RunContext(model=eng.model, tools=eng.tools)
    graph_input: dict[str, Any] = {"messages": [HumanMessage("go")], "run_id": "floor", "step": 0}
    try:
        async for part in eng.graph.astream(
            graph_input, config, context=context, stream_mode=STREAM_MODES, durability="sync"
        ):
            writer.add(encode(part))
        writer.close()
        await task
    finally:
        if not task.done():
            task.cancel()
    return writer.seq, writer.commits
