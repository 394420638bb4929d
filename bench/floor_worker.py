"""Crash-safe execution at its least: rung L3 of bench/floor.py, the worker and its schema.

What it adds to L2's durable event log, each the one mechanism behind one of agentrt's
guarantees:

- **A run outlives the process that accepted it and the one that runs it.** The server only
  stores the run, queued, with its `run.created` and a NOTIFY (bench/floor_server.py
  `--queued`); a worker process claims it (one statement: the oldest queued run, `FOR UPDATE
  SKIP LOCKED`, its lease taken and its generation bumped, with `run.started` appended in the
  same transaction) and renews its leases every second. Taking back a run whose lease ran out
  is left out: it costs nothing while workers live, and what it needs during a run, the
  lease and its renewal, is here.
- **Fencing.** Every write of an attempt, checkpoint or event, runs in one transaction with
  `floor_fence(run, generation)`, which takes the run's shared advisory lock and fails when
  the generation moved on; a takeover takes that lock exclusively before it bumps it. A
  worker that lost its lease can write nothing that wins. A step's task writes wait for the
  step's checkpoint and commit in its transaction, the input checkpoint in the first step's,
  the checkpoints of the steps a later attempt may run again at no cost (the first step,
  building the context, the tools' step) in the next step's or in the next event batch's
  (ahead of the events), and the graph's last checkpoint in the transaction that ends the run
  (`HoldingPostgresSaver`), as agentrt's do.
- **Tools run once.** A later attempt finds a call's recorded result and does not run the
  tool again. On a run's first attempt, the calls of a tool that is safe to run again (the
  calculator) are recorded with their result in the next event batch's transaction, as
  agentrt's are (docs/decisions/2026): no earlier attempt can have recorded anything, and a
  crash before that commit only runs the tool again. Otherwise the call is recorded
  (committed) before the tool runs, and its result (committed) before the graph goes on.

The events reach the server in their NOTIFY payloads (a batch fits in one), so it reads
nothing back. Left out, as in L2: traces, cost ledger, snapshot, authentication,
conversations, agent profiles, limits.

`python -m bench.floor_worker --database-url U` runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import os
import signal
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.postgres import _ainternal
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import DictRow, dict_row

from bench.engine import Engine, engine
from bench.floor_log import CREATED, TERMINAL, Pool, Writer, encode, event_pool
from graphs.context import RunContext
from server import loops
from server.db.checkpoint import FENCE_LAST, HoldingPostgresSaver, LastCheckpoint
from server.events.projection import STREAM_MODES

QUEUED_CHANNEL = "floor_runs"
EVENTS_CHANNEL = "floor_live"
LEASE_S = 3.0
# A NOTIFY payload must stay under 8,000 bytes; a longer batch is announced by its seqs only.
PAYLOAD_MAX = 7_900

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS floor_runs (id text PRIMARY KEY,"
    " status text NOT NULL DEFAULT 'queued',"
    " created_at timestamptz NOT NULL DEFAULT clock_timestamp(),"
    " owner text, lease_until timestamptz, generation int NOT NULL DEFAULT 0)",
    "CREATE INDEX IF NOT EXISTS floor_runs_queued ON floor_runs (created_at)"
    " WHERE status = 'queued'",
    "CREATE TABLE IF NOT EXISTS floor_tool_calls"
    " (run_id text, call_id text, result text, PRIMARY KEY (run_id, call_id))",
    """CREATE OR REPLACE FUNCTION floor_fence(run text, gen int) RETURNS int
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock_shared(hashtext(run));
        IF NOT EXISTS (SELECT 1 FROM floor_runs WHERE id = run AND generation = gen) THEN
            RAISE EXCEPTION 'run % moved past generation %', run, gen;
        END IF;
        RETURN gen;
    END $$""",
)

# The server's one statement per accepted run: the run, its first event and the wake-up.
ACCEPT = (
    "WITH run AS (INSERT INTO floor_runs (id) VALUES (%(run)s)), "
    "ev AS (INSERT INTO floor_events (run_id, seq, data) VALUES (%(run)s, 1, %(created)s)) "
    f"SELECT pg_notify('{QUEUED_CHANNEL}', '')"
)
# The claim: the oldest queued run nobody is taking over, leased and fenced anew.
CLAIM = (
    "UPDATE floor_runs SET status = 'running', owner = %(owner)s, generation = generation + 1,"
    f" lease_until = clock_timestamp() + interval '{LEASE_S} s'"
    " WHERE id = (SELECT id FROM floor_runs WHERE status = 'queued'"
    "   AND pg_try_advisory_xact_lock(hashtext(id))"
    "   ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)"
    " RETURNING id, generation,"
    " (SELECT max(seq) FROM floor_events e WHERE e.run_id = floor_runs.id) AS seq"
)
# A fenced append: the events, and their payload for the server, commit only while the run is
# still this attempt's; the last one also ends the run.
APPEND = (
    "WITH fence AS (SELECT floor_fence(%(run)s, %(gen)s)), "
    "appended AS (INSERT INTO floor_events (run_id, seq, data) SELECT %(run)s, s, d "
    "  FROM fence, jsonb_to_recordset(%(rows)s::jsonb) AS t(s int, d jsonb)) "
    f"SELECT pg_notify('{EVENTS_CHANNEL}', %(payload)s) FROM fence"
)
END_RUN = (
    "UPDATE floor_runs SET status = 'completed', owner = NULL, lease_until = NULL"
    " WHERE id = %s AND generation = %s"
)
RENEW = (
    f"UPDATE floor_runs SET lease_until = clock_timestamp() + interval '{LEASE_S} s'"
    " WHERE owner = %s AND status = 'running'"
)

# The attempt the current task runs: (run id, generation), and its event writer.
_attempt: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "floor_attempt", default=None
)
_writer: contextvars.ContextVar[AttemptWriter | None] = contextvars.ContextVar(
    "floor_writer", default=None
)


def payload(run_id: str, first: int, batch: list[str]) -> str:
    """The NOTIFY payload of a committed batch: its events, or only its seqs if too long."""
    text = f'{{"run":"{run_id}","first":{first},"events":[{",".join(batch)}]}}'
    if len(text.encode()) <= PAYLOAD_MAX:
        return text
    return f'{{"run":"{run_id}","first":{first},"last":{first + len(batch) - 1}}}'


async def create_schema(pool: Pool) -> None:
    """Create the floor's run table, tool ledger and fence function (idempotent)."""
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_advisory_lock(7262616099)")
        try:
            for statement in SCHEMA:
                await conn.execute(statement)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(7262616099)")


async def accept(pool: Pool, run_id: str) -> None:
    """Store a new run, queued, with its `run.created`, and wake the workers (one commit)."""
    async with pool.connection() as conn:
        await conn.execute(ACCEPT, {"run": run_id, "created": CREATED})


class FencedSaver(HoldingPostgresSaver):
    """The holding saver whose writes for an attempt first pass `floor_fence`, in their txn.

    An attempt's task writes wait for the checkpoint of their step and go in its transaction,
    as agentrt's do (docs/decisions/2018).
    """

    def _holds(self, config: RunnableConfig) -> bool:
        return _attempt.get() is not None

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        attempt = _attempt.get()
        if attempt is None or not pipeline:
            async with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        # One implicit transaction up to the pipeline's Sync: the fence and the writes commit
        # together; a pool connection per write, so runs do not wait for each other.
        async with (
            _ainternal.get_connection(self.conn) as conn,
            conn.pipeline(),
            conn.cursor(binary=True, row_factory=dict_row) as cur,
        ):
            await cur.execute("SELECT floor_fence(%s, %s)", attempt)
            yield cur


class AttemptWriter(Writer):
    """One attempt's event writer: its batches are fenced, and announced with their events."""

    def __init__(self, pool: Pool, run_id: str, generation: int, seq: int) -> None:
        super().__init__(pool, run_id, None)
        self.generation, self.seq = generation, seq
        # The graph's last checkpoint, held by the saver for the run's end (as agentrt's).
        self.last = LastCheckpoint()
        # Tool calls of a first attempt, (call id, result), for the next batch's transaction.
        self.held: list[tuple[str, str]] = []

    async def commit(self, batch: list[str], conn: AsyncConnection[Any] | None = None) -> None:
        """Append `batch` behind the fence and commit it (in `conn`'s transaction if given).

        The terminal batch also marks the run completed, in the same transaction, after the
        graph's last checkpoint (held for it).
        """
        first = self.seq + 1
        rows = ",".join(f'{{"s":{n},"d":{d}}}' for n, d in enumerate(batch, first))
        params = {
            "run": self.run_id,
            "gen": self.generation,
            "rows": f"[{rows}]",
            "payload": payload(self.run_id, first, batch),
        }
        held, self.held = self.held, []
        if conn is not None:  # inside the caller's transaction (the claim)
            await conn.execute(APPEND, params)
        else:
            async with self.pool.connection() as own:
                if self.closed and batch[-1] == TERMINAL:
                    async with own.pipeline(), own.transaction():
                        if (last := self.last.take()) is not None:
                            await last(own)  # rolls back with a fenced-out append
                        await own.execute(APPEND, params)
                        await self._record(own, held)
                        await own.execute(END_RUN, (self.run_id, self.generation))
                elif (lead := self.last.lead()) is not None:
                    # Deferred checkpoints go first: no event ahead of its step's checkpoint.
                    try:
                        async with own.pipeline(), own.transaction():
                            await lead.write(own)
                            await own.execute(APPEND, params)
                            await self._record(own, held)
                    except BaseException as exc:
                        lead.landed(exc)
                        raise
                    lead.landed(None)
                elif held:
                    async with own.pipeline(), own.transaction():
                        await own.execute(APPEND, params)
                        await self._record(own, held)
                else:
                    await own.execute(APPEND, params)
        self.seq += len(batch)
        self.commits += 1

    async def _record(self, conn: AsyncConnection[Any], held: list[tuple[str, str]]) -> None:
        """Record held tool calls with their results, in the batch's (fenced) transaction."""
        if held:
            await conn.cursor().executemany(
                "INSERT INTO floor_tool_calls (run_id, call_id, result) VALUES (%s, %s, %s)"
                " ON CONFLICT (run_id, call_id) DO NOTHING",
                [(self.run_id, call_id, result) for call_id, result in held],
            )


def ledgered(tool: BaseTool, pool: Pool) -> BaseTool:
    """`tool` (safe to run again) with its calls recorded, and each call run once.

    On a first attempt (generation 1) a call is recorded with its result in the next event
    batch's transaction. Otherwise it is recorded before it runs and its result after (each
    committed), and a call whose result is already recorded returns that result.
    """

    async def call(**kwargs: Any) -> str:
        attempt, writer = _attempt.get(), _writer.get()
        assert attempt is not None and writer is not None
        run_id, generation = attempt
        call_id = json.dumps(kwargs, sort_keys=True)
        if generation == 1:
            result = str(await tool.ainvoke(kwargs))
            writer.held.append((call_id, result))
            return result
        async with pool.connection() as conn, conn.pipeline(), conn.transaction():
            await conn.execute("SELECT floor_fence(%s, %s)", (run_id, generation))
            cur = await conn.execute(
                "INSERT INTO floor_tool_calls (run_id, call_id) VALUES (%s, %s)"
                " ON CONFLICT (run_id, call_id) DO UPDATE SET call_id = EXCLUDED.call_id"
                " RETURNING result",
                (run_id, call_id),
            )
            row = await cur.fetchone()
        if row is not None and row["result"] is not None:
            return str(row["result"])
        result = str(await tool.ainvoke(kwargs))
        async with pool.connection() as conn, conn.pipeline(), conn.transaction():
            await conn.execute("SELECT floor_fence(%s, %s)", (run_id, generation))
            await conn.execute(
                "UPDATE floor_tool_calls SET result = %s WHERE run_id = %s AND call_id = %s",
                (result, run_id, call_id),
            )
        return result

    return StructuredTool.from_function(
        coroutine=call, name=tool.name, description=tool.description, args_schema=tool.args_schema
    )


class FloorWorker:
    """Claim queued runs and run them, `concurrency` at a time."""

    def __init__(self, eng: Engine, pool: Pool, database_url: str, concurrency: int) -> None:
        self.eng, self.pool, self.database_url = eng, pool, database_url
        self.concurrency = concurrency
        self.owner = f"floor:{os.getpid()}"
        self.tasks: set[asyncio.Task[None]] = set()
        self.wake = asyncio.Event()
        self.tools = [ledgered(t, pool) for t in eng.tools]

    async def listen(self) -> None:
        """Wake the claim loop at every queued notification."""
        conn = await AsyncConnection.connect(self.database_url, autocommit=True)
        async with conn:
            await conn.execute(f"LISTEN {QUEUED_CHANNEL}")
            self.wake.set()  # runs queued before we listened
            async for _ in conn.notifies():
                self.wake.set()

    async def heartbeat(self) -> None:
        """Renew the leases of the runs this worker holds, every third of a lease."""
        while True:
            await asyncio.sleep(LEASE_S / 3)
            with contextlib.suppress(Exception):
                async with self.pool.connection() as conn:
                    await conn.execute(RENEW, (self.owner,))

    async def claim_loop(self) -> None:
        """Claim while there are queued runs and free slots; wait for a wake-up, or 1 s."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 1.0)
            self.wake.clear()
            while len(self.tasks) < self.concurrency and await self.claim_one():
                pass

    async def claim_one(self) -> bool:
        """Claim the oldest queued run and start it; False when there was none."""
        async with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
            cur = await conn.execute(CLAIM, {"owner": self.owner})
            row = await cur.fetchone()
            if row is None:
                return False
            writer = AttemptWriter(self.pool, row["id"], row["generation"], row["seq"] or 0)
            await writer.commit([json.dumps({"type": "run.started"})], conn)
        task = asyncio.create_task(self.execute(writer))
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return True

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.wake.set()

    async def execute(self, writer: AttemptWriter) -> None:
        """Run the attempt's graph, every write fenced, every stream part logged."""
        _attempt.set((writer.run_id, writer.generation))
        _writer.set(writer)
        pump = asyncio.create_task(writer.run())
        config: RunnableConfig = {
            "configurable": {"thread_id": writer.run_id, FENCE_LAST: writer.last}
        }
        context = RunContext(
            model=self.eng.model,
            tools=self.tools,
            ending=writer.last.expect,
            deferring=writer.last.defer,
        )
        graph_input = {"messages": [HumanMessage("go")], "run_id": "floor", "step": 0}
        try:
            async for part in self.eng.graph.astream(
                graph_input, config, context=context, stream_mode=STREAM_MODES, durability="sync"
            ):
                writer.add(encode(part))
            writer.close()
            await pump
        except Exception:
            traceback.print_exc()  # the worker's output is the benchmark's log
        finally:
            writer.last.discard()  # left held only when the attempt failed
            if not pump.done():
                pump.cancel()


async def serve(database_url: str, concurrency: int) -> None:
    """Run the worker until cancelled."""
    async with (
        engine(database_url, saver=FencedSaver) as eng,
        event_pool(database_url) as pool,
    ):
        await create_schema(pool)
        worker = FloorWorker(eng, pool, database_url, concurrency)
        loops = [
            asyncio.create_task(worker.listen()),
            asyncio.create_task(worker.heartbeat()),
            asyncio.create_task(worker.claim_loop()),
        ]
        print("ready", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        for task in [*loops, *worker.tasks]:
            task.cancel()
        await asyncio.gather(*loops, *worker.tasks, return_exceptions=True)


def main() -> None:
    """Parse the arguments and serve."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    loops.run(serve(args.database_url, args.concurrency), "auto")


if __name__ == "__main__":
    main()
