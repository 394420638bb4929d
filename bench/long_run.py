"""A run with 100,000 events: snapshot, reconnect near the end, full replay, write throughput.

The run is real: the worker executes a calculator call, then a scripted answer streamed one
character per chunk, so every character is one `message.item.delta` event. Baselines, in
the same run: the same reads on a small run (27 events), Postgres reading and COPYing the
same rows with nothing of ours around it.
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
from graphs.events import EventType
from server.db.pool import Conn, Pool, open_pool
from server.events.log import NewEvent, append_events
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
    await conn.execute(
        "INSERT INTO conversations (id, tenant_id, user_id) VALUES (%s, %s, %s)",
        (conv, tenant, user),
    )
    await conn.execute(
        "INSERT INTO messages (id, conversation_id, tenant_id, user_id, role, content)"
        " VALUES (%s, %s, %s, %s, 'user', 'go')",
        (msg, conv, tenant, user),
    )
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
    writer.emit(EventType.MESSAGE_ITEM_CREATED, {"itemId": "item", "role": "assistant"})
    for n in range(events):
        writer.emit(EventType.MESSAGE_ITEM_DELTA, {"itemId": "item", "delta": "x"})
        if n % 100 == 0:
            await asyncio.sleep(0)  # let the writer commit while "tokens" keep coming
    await writer.flush()
    took = time.perf_counter() - started
    await writer.close()
    return (events + 1) / took


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
            cur = await conn.execute(
                "SELECT seq, type, ts, data::text FROM run_events WHERE run_id = %s AND seq > %s"
                " ORDER BY seq LIMIT %s",
                (run_id, cursor, page),
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
    big = await post(ep, "scripted:long")
    record = await wait_done(ep, big, 900)
    wall = time.perf_counter() - posted
    last = int(record["lastEventId"])  # type: ignore[call-overload]
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT min(ts) FILTER (WHERE type = 'message.item.created'),"
            " max(ts), count(*) FROM run_events WHERE run_id = %s",
            (big,),
        )
        first_ts, last_ts, stored = await cur.fetchone()  # type: ignore[misc]
    during = (stored - 5) / (last_ts - first_ts).total_seconds()

    snap_big = await timed(repeats * 10, lambda: request(ep, "GET", f"/api/runs/{big}/snapshot"))
    snap_small = await timed(
        repeats * 10, lambda: request(ep, "GET", f"/api/runs/{small}/snapshot")
    )
    reconnect = [
        await sse(ep, f"/api/runs/{big}/events", last_event_id=last - 100)
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
        f"The run: {stored:,} events stored ({last:,} seq), produced in {wall:.1f} s from the "
        f"POST to `run.completed`."
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
        f"| write while the run produces events | {during:,.0f} events/s | | | "
        f"≥ 20,000/s {met(during >= 20_000)} |"
    )
    f.add(
        f"| write capacity of the log (EventWriter, group commit) | {med(capacity):,.0f} "
        f"events/s | raw COPY of the same rows {med(raw_copies):,.0f} rows/s | "
        f"{med(capacity) / med(raw_copies):.2f}x | ≥ 20,000/s {met(med(capacity) >= 20_000)} |"
    )
    f.add("")
    f.add(
        "The write rate while the run produces events is bounded by the producer (LangGraph "
        "streaming one chunk per character through the scripted model); the capacity row is "
        "the log alone, fed as fast as `emit` can be called."
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
