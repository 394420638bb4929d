"""A run with 100,000 events: snapshot, reconnect near the end, full replay, write throughput.

A worker joins the text pieces of an answer that come together into one
`message.item.delta` (docs/decisions/2024), so no real run of this machine stores 100,000
events for an answer of 100,000 characters: the 100,000-event run is seeded straight into the
tables (`bench.seed.seed_long_run`: one delta per character, as the log stored them before
the join), and read through the API. A real run streaming such an answer one character per
chunk is measured beside it: how fast its text reaches the log, in how many events.
Baselines, in the same run: the same reads on a small real run, Postgres reading and COPYing
the same rows with nothing of ours around it.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from bench.client import Endpoint, request, sse
from bench.common import (
    Figures,
    env_for,
    met,
    processes,
    run_async,
    start_stack,
    stat_line,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT, TOOL_TURN
from bench.overhead import agentrt_run, conversations
from bench.seed import seed_conversation, seed_long_run
from graphs.events import EventType
from server.db.pool import Conn, Pool, open_pool
from server.events.log import READ_EVENTS, NewEvent, append_events
from server.events.writer import EventWriter
from server.ids import new_id
from server.settings import Settings

OTHER_EVENTS = 7  # created, started, tool started/completed, item created/completed, completed


async def post(ep: Endpoint, model: str) -> str:
    """Post one message and return the id of the run it starts."""
    conv = (await conversations(ep, 1))[0]
    run = await request(
        ep, "POST", f"/api/conversations/{conv}/messages", {"content": "go", "model": model}
    )
    return str(run["runId"])


async def wait_done(ep: Endpoint, run_id: str, limit_s: float) -> dict[str, object]:
    """Poll a run until it ends or `limit_s` passes; return its record."""
    async with asyncio.timeout(limit_s):
        while True:
            record = await request(ep, "GET", f"/api/runs/{run_id}")
            if record["status"] in ("completed", "failed", "cancelled"):
                return dict(record)
            await asyncio.sleep(0.2)


async def timed(repeats: int, make: object) -> list[float]:
    """Await `make` `repeats` times and return each duration in milliseconds."""
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        await make()  # type: ignore[operator]
        out.append(time.perf_counter() - started)
    return out


async def bare_run(conn: Conn, tenant: str, user: str) -> str:
    """Insert a queued run (and its conversation and message) straight into the tables."""
    run_id, conv, msg = new_id("run"), new_id("conv"), new_id("msg")
    await seed_conversation(conn, conv, msg, tenant, user, "go")
    await conn.execute(
        "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id)"
        " VALUES (%s, %s, %s, %s, 'bench', %s)",
        (run_id, conv, tenant, user, msg),
    )
    return run_id


async def writer_capacity(pool: Pool, events: int) -> float:
    """Store `events` deltas through an EventWriter as fast as it takes them; return events/s."""
    async with pool.connection() as conn, conn.transaction():
        run_id = await bare_run(conn, "bench", "bench")
        head, _ = await append_events(
            conn,
            run_id,
            [NewEvent(EventType.RUN_CREATED), NewEvent(EventType.RUN_STARTED, {"attempt": 1})],
        )
    writer = EventWriter(pool, head)
    started = time.perf_counter()
    for item in ("item0", "item1"):
        writer.emit(EventType.MESSAGE_ITEM_CREATED, {"itemId": item, "role": "assistant"})
    for n in range(events):
        # Two items in turn: adjacent deltas of one item would be joined into one row.
        writer.emit(EventType.MESSAGE_ITEM_DELTA, {"itemId": f"item{n % 2}", "delta": "x"})
        if n % 100 == 0:
            await asyncio.sleep(0)  # let the writer commit while "tokens" keep coming
    await writer.flush()
    took = time.perf_counter() - started
    await writer.close()
    return (events + 2) / took


async def raw_copy(database_url: str, events: int, batch: int = 2000) -> float:
    """COPY the same rows into a bare copy of run_events, in `batch`-row transactions."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS bench_copy")
        await conn.execute("CREATE TABLE bench_copy (LIKE run_events INCLUDING ALL)")
        now = datetime.now(UTC)
        started = time.perf_counter()
        for first in range(0, events, batch):
            async with (
                conn.transaction(),
                conn.cursor() as cur,
                cur.copy(
                    "COPY bench_copy (run_id, seq, type, ts, attempt, data) FROM STDIN"
                ) as copy,
            ):
                for seq in range(first, min(events, first + batch)):
                    await copy.write_row(
                        ("run", seq, "message.item.delta", now, 1, '{"itemId":"i","delta":"x"}')
                    )
        took = time.perf_counter() - started
        await conn.execute("DROP TABLE bench_copy")
    return events / took


async def raw_read(database_url: str, run_id: str, page: int = 5000) -> float:
    """Read the run's rows in pages, as the SSE replay does, with nothing else; events/s."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        started, cursor, count = time.perf_counter(), 0, 0
        while True:
            # The replay's statement (its bounds on `ts` skip the daily partitions outside the
            # run's lifetime), without our encoding and HTTP around it.
            cur = await conn.execute(
                READ_EVENTS,
                {"run": run_id, "after": cursor, "limit": page},
            )
            rows = await cur.fetchall()
            if not rows:
                break
            cursor, count = rows[-1][0], count + len(rows)
        return count / (time.perf_counter() - started)


async def measure(database_url: str, ep: Endpoint, events: int, repeats: int, f: Figures) -> None:
    """Seed a run of `events` events and time its snapshot and replay."""
    small = await post(ep, "scripted:bench")
    await wait_done(ep, small, 60)
    for conv in await conversations(ep, 3):
        await agentrt_run(ep, conv)  # warm up

    posted = time.perf_counter()
    streamed = await post(ep, "scripted:long")
    await wait_done(ep, streamed, 900)
    wall = time.perf_counter() - posted
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT min(ts) FILTER (WHERE type = 'message.item.created'), max(ts),"
            " count(*) FILTER (WHERE type = 'message.item.delta') FROM run_events"
            " WHERE run_id = %s",
            (streamed,),
        )
        first_ts, last_ts, deltas = await cur.fetchone()  # type: ignore[misc]
        cur = await conn.execute("SELECT tenant_id, user_id FROM runs WHERE id = %s", (small,))
        tenant, user = await cur.fetchone()  # type: ignore[misc]
        async with conn.transaction():
            big = await seed_long_run(conn, tenant, user, events)
        cur = await conn.execute("SELECT count(*) FROM run_events WHERE run_id = %s", (big,))
        (stored,) = await cur.fetchone()  # type: ignore[misc]
    last = events
    chars_per_s = (events - OTHER_EVENTS) / (last_ts - first_ts).total_seconds()

    snap_big = await timed(repeats * 10, lambda: request(ep, "GET", f"/api/runs/{big}/snapshot"))
    snap_small = await timed(
        repeats * 10, lambda: request(ep, "GET", f"/api/runs/{small}/snapshot")
    )
    reconnect = [
        await sse(ep, f"/api/runs/{big}/events", last_event_id=max(last - 100, 0))
        for _ in range(repeats * 10)
    ]
    small_replay = [await sse(ep, f"/api/runs/{small}/events") for _ in range(repeats * 10)]
    replays = []
    for _ in range(repeats):
        started = time.perf_counter()
        times = await sse(ep, f"/api/runs/{big}/events")
        assert times.events == last, (times.events, last)
        replays.append(times.events / (times.end - started))
    raw_reads = [await raw_read(database_url, big) for _ in range(repeats)]

    settings = Settings(database_url=database_url)
    async with open_pool(database_url, settings) as pool:
        capacity = [await writer_capacity(pool, events) for _ in range(repeats)]
    raw_copies = [await raw_copy(database_url, events) for _ in range(repeats)]

    recon_first = [r.first_byte - r.start for r in reconnect]
    recon_end = [r.end - r.start for r in reconnect]
    small_end = [r.end - r.start for r in small_replay]
    med = statistics.median
    f.add(
        f"The 100,000-event run: {stored:,} events stored (seq 1 to {last:,}), seeded (one "
        f"delta per character). The real run beside it streamed an answer of "
        f"{events - OTHER_EVENTS:,} characters one per chunk in {wall:.1f} s from the POST to "
        f"`run.completed`; the log stored its text as {deltas:,} deltas."
    )
    f.add("")
    f.add("| measure | 100,000-event run | baseline | ratio | target |")
    f.add("|---|---|---|---|---|")
    f.add(
        f"| snapshot fetch (`GET /snapshot`) | {stat_line(snap_big)} | small run "
        f"{med(snap_small) * 1000:.1f} ms | {med(snap_big) / med(snap_small):.1f}x | "
        f"≤ 20 ms {met(med(snap_big) <= 0.020)} |"
    )
    f.add(
        f"| reconnect with `Last-Event-ID` = last - 100: first byte | {stat_line(recon_first)} "
        f"| | | |"
    )
    f.add(
        f"| reconnect with `Last-Event-ID` = last - 100: to the end | {stat_line(recon_end)} | "
        f"full replay of the small run {med(small_end) * 1000:.1f} ms | "
        f"{med(recon_end) / med(small_end):.1f}x | ≤ 50 ms {met(med(recon_end) <= 0.050)} |"
    )
    f.add(
        f"| full replay to one client | {med(replays):,.0f} events/s | Postgres reading the "
        f"same pages {med(raw_reads):,.0f} rows/s | {med(replays) / med(raw_reads):.2f}x | "
        f"≥ 50,000/s {met(med(replays) >= 50_000)} |"
    )
    f.add(
        f"| text stored while a real run streams it one character per chunk | "
        f"{chars_per_s:,.0f} characters/s in {deltas:,} events | | | "
        f"≥ 20,000/s {met(chars_per_s >= 20_000)} |"
    )
    f.add(
        f"| write capacity of the log (EventWriter, group commit) | {med(capacity):,.0f} "
        f"events/s | raw COPY of the same rows {med(raw_copies):,.0f} rows/s | "
        f"{med(capacity) / med(raw_copies):.2f}x | ≥ 20,000/s {met(med(capacity) >= 20_000)} |"
    )
    f.add("")
    f.add(
        "The text rate of the real run is bounded by its producer (LangGraph streaming one "
        "chunk per character through the scripted model); the worker joins the pieces that "
        "come together into one delta. The capacity row is the log alone, fed as fast as "
        "`emit` can be called with deltas of two items in turn, which the writer cannot join, "
        "so each is a row."
    )


def main(database_url: str, quick: bool) -> Figures:
    """Measure snapshot, replay and fold times for long runs."""
    figures = Figures("100,000-event run", "make bench (bench/long_run.py)")
    events = 100_000
    text = "x" * (events - OTHER_EVENTS)
    scripts = {"bench": AGENT_SCRIPT, "long": [TOOL_TURN, {"text": text, "chunk_chars": 1}]}
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-long-"))
    env = env_for(database_url, scripted_models_file=str(write_scripts(folder, scripts)))
    procs = start_stack(env, workers=1)
    assert procs[0].url is not None
    with processes(procs):
        run_async(
            measure(database_url, Endpoint.of(procs[0].url), events, 1 if quick else 3, figures)
        )
    return figures
