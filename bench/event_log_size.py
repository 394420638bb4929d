"""Append and replay on an empty event log against a log holding 10,000,000 events.

Each measure runs on a fresh run, on an empty log (a database of its own) and on the seeded
one (the benchmark's database) on the same server, each with its own API process, in turns
(`ROUNDS`, the order swapped at each), so that the machine's drift falls on both alike:

- append: one event per `append_events` call (the worker's path for a step's events: the
  fenced run-row update, COPY, NOTIFY, in one transaction), and the `EventWriter`'s capacity
  (deltas fed as fast as `emit` takes them, group commit);
- replay: a finished 2,000-event run read in full through the API process's SSE endpoint
  (`GET /api/runs/{id}/events`), and a reconnect with `Last-Event-ID` 100 events before the end.

The seed spreads 10,000,000 events over 3,000 finished runs in 30 daily partitions (today's
included, where the measured runs write), with `INSERT ... SELECT generate_series` per day.
It runs with `session_replication_role = replica`, which skips the per-row foreign-key check
and the insert triggers: the seeded runs' rows exist, and the triggers act only on event
types the seed does not write; without it the seed takes about 7 minutes instead of the
few it takes here. `VACUUM ANALYZE` follows, as autovacuum would on a live database, then a
`CHECKPOINT` (of the whole server, the empty log's database included), before any measure.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from bench.client import Endpoint, sse
from bench.common import (
    Figures,
    Proc,
    database_url_for,
    env_for,
    processes,
    run_async,
    start_api,
    stat_line,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT
from bench.long_run import bare_run, writer_capacity
from graphs.events import EventType
from server.db.pool import Pool, migrate, open_pool
from server.events.log import NewEvent, append_events
from server.settings import Settings

DAYS = 30
RUNS_PER_DAY = 100
REPLAY_EVENTS = 2000
ROUNDS = 4  # turns of the empty and the seeded log, their order swapped at each
EMPTY_DATABASE = "agentrt_bench_empty_log"


def _settings(url: str) -> Settings:
    return Settings(_env_file=None, DATABASE_URL=url, event_retention_days=DAYS + 30)  # type: ignore[call-arg]


async def _new_run(pool: Pool) -> str:
    """A queued run of the API's default user (so its stream can be read); its id."""
    async with pool.connection() as conn, conn.transaction():
        return await bare_run(conn, "default", "local")


async def appends(pool: Pool, count: int) -> list[float]:
    """Seconds per `append_events` call of one delta on a live run, then the run completes."""
    run_id = await _new_run(pool)
    out = []
    async with pool.connection() as conn:
        head, _ = await append_events(
            conn,
            run_id,
            [NewEvent(EventType.RUN_CREATED), NewEvent(EventType.RUN_STARTED, {"attempt": 1})],
        )
        head, _ = await append_events(
            conn,
            run_id,
            [NewEvent(EventType.MESSAGE_ITEM_CREATED, {"itemId": "i", "role": "assistant"})],
            head=head,
        )
        for n in range(count):
            delta = NewEvent(EventType.MESSAGE_ITEM_DELTA, {"itemId": "i", "delta": f"w{n} "})
            began = time.perf_counter()
            head, _ = await append_events(conn, run_id, [delta], head=head)
            out.append(time.perf_counter() - began)
        await append_events(conn, run_id, [NewEvent(EventType.RUN_COMPLETED, {})], head=head)
    return out


async def replays(pool: Pool, ep: Endpoint, repeats: int) -> tuple[list[float], list[float]]:
    """Full replays and near-the-end reconnects of a finished run, through the SSE endpoint."""
    run_id = await _new_run(pool)
    async with pool.connection() as conn:
        head, _ = await append_events(
            conn,
            run_id,
            [
                NewEvent(EventType.RUN_CREATED),
                NewEvent(EventType.RUN_STARTED, {"attempt": 1}),
                NewEvent(EventType.MESSAGE_ITEM_CREATED, {"itemId": "i", "role": "assistant"}),
                *(
                    NewEvent(EventType.MESSAGE_ITEM_DELTA, {"itemId": "i", "delta": f"w{n} "})
                    for n in range(REPLAY_EVENTS - 4)
                ),
                NewEvent(EventType.RUN_COMPLETED, {}),
            ],
        )
    await sse(ep, f"/api/runs/{run_id}/events")  # warm up: not measured
    full, tail = [], []
    for _ in range(repeats):
        times = await sse(ep, f"/api/runs/{run_id}/events")
        assert times.events == head.seq and times.terminal == "run.completed", times
        full.append(times.end - times.start)
        times = await sse(ep, f"/api/runs/{run_id}/events", last_event_id=head.seq - 100)
        assert times.events == 100, times
        tail.append(times.end - times.start)
    return full, tail


async def measure(
    url: str, ep: Endpoint, count: int, repeats: int, captures: int
) -> dict[str, list[float]]:
    """All four measures on fresh runs."""
    async with open_pool(url, _settings(url)) as pool:
        append_s = await appends(pool, count)
        full, tail = await replays(pool, ep, repeats)
        capacity = [await writer_capacity(pool, 20_000) for _ in range(captures)]
    return {"append": append_s, "full": full, "tail": tail, "capacity": capacity}


def seed(url: str, total: int) -> tuple[int, float]:
    """Seed `total` events over DAYS daily partitions; return the rows stored and seconds."""
    per_run = total // (DAYS * RUNS_PER_DAY)
    now = datetime.now(UTC)
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT agentrt_ensure_day_partitions('run_events', %s, %s)",
            ((now - timedelta(days=DAYS - 1)).date(), now.date()),
        )
        conn.execute("SET session_replication_role = replica")
        for day in range(DAYS):
            start = now - timedelta(days=day, hours=2)
            params = {"day": f"{day:02d}", "start": start, "n": per_run, "runs": RUNS_PER_DAY}
            with conn.transaction():
                conn.execute(
                    "INSERT INTO conversations (id, tenant_id, user_id)"
                    " VALUES ('conv_seed_' || %(day)s, 'seed', 'seed')",
                    params,
                )
                conn.execute(
                    "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
                    " input_message_id, status, created_at, finished_at, updated_at,"
                    " last_event_seq)"
                    " SELECT 'run_seed_' || %(day)s || '_' || lpad(r::text, 4, '0'),"
                    " 'conv_seed_' || %(day)s, 'seed', 'seed', 'm', 'msg', 'completed',"
                    " %(start)s, %(start)s + interval '1 hour', %(start)s + interval '1 hour',"
                    " %(n)s FROM generate_series(1, %(runs)s) r",
                    params,
                )
                # In key order (run, seq), so that the index grows at its right edge.
                conn.execute(
                    "INSERT INTO run_events (run_id, seq, type, ts, attempt, data)"
                    " SELECT 'run_seed_' || %(day)s || '_' || lpad(r::text, 4, '0'), s,"
                    " 'message.item.delta', %(start)s + make_interval(secs => s * 0.001), 1,"
                    " jsonb_build_object('itemId', 'i', 'delta', 'w' || s || ' ')"
                    " FROM generate_series(1, %(runs)s) r, generate_series(1, %(n)s) s"
                    " ORDER BY 1, 2",
                    params,
                )
            print(f"seeded day {day + 1}/{DAYS}: {time.perf_counter() - began:.0f} s", flush=True)
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM ANALYZE run_events")
        # Written out now, so that the checkpoint the seed's WAL calls for does not run
        # (and compete for the disk) during the measures that follow.
        conn.execute("CHECKPOINT")
        row = conn.execute("SELECT count(*) FROM run_events").fetchone()
    assert row is not None
    return int(row[0]), time.perf_counter() - began


def main(database_url: str, quick: bool) -> Figures:
    """Measure append and replay on an empty log and on a 10,000,000-event log, in turns."""
    figures = Figures("Event log at 10 million rows", "make bench-large (bench/event_log_size.py)")
    total = 300_000 if quick else 10_000_000
    count, repeats = (300, 6) if quick else (2000, 20)
    rounds = 2 if quick else ROUNDS
    # The empty log is a database of its own beside the seeded one, on the same server, each
    # with its own API process, so that the two are measured in turns: this machine's speed
    # drifts by more than the seed's effect between one block of measures and the next.
    empty_url = database_url_for(database_url, EMPTY_DATABASE)
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-log-size-"))
    scripts = str(write_scripts(folder, {"b": AGENT_SCRIPT}))

    async def setup() -> None:
        for url in (empty_url, database_url):
            async with open_pool(url, _settings(url)) as pool:
                await migrate(pool)

    run_async(setup())
    apis: list[Proc] = []
    with processes(apis):  # stops what was started, should the second fail to start
        eps = []
        for url in (empty_url, database_url):
            apis.append(start_api(env_for(url, scripted_models_file=scripts)))
            assert apis[-1].url is not None
            eps.append(Endpoint.of(apis[-1].url))
        stored, took = seed(database_url, total)
        empty: dict[str, list[float]] = {}
        full: dict[str, list[float]] = {}
        for turn in range(rounds):
            pairs = [(empty_url, eps[0], empty), (database_url, eps[1], full)]
            for url, ep, into in pairs if turn % 2 == 0 else reversed(pairs):
                got = run_async(measure(url, ep, count // rounds, repeats // rounds, 1))
                for key, values in got.items():
                    into.setdefault(key, []).extend(values)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{EMPTY_DATABASE}"')
    med = statistics.median
    figures.add(
        f"The seed: {stored:,} events in {DAYS} daily partitions over "
        f"{DAYS * RUNS_PER_DAY:,} runs, stored in {took:.0f} s (with `VACUUM ANALYZE`). "
        f"Each measure on a fresh run; the empty log (a database of its own on the same "
        f"server, with its own API process) and the seeded one measured in {rounds} turns, "
        "their order swapped at each, and the figures pooled over the turns."
    )
    figures.add("")
    figures.add(f"| measure | empty log | {stored:,}-event log | ratio (median) |")
    figures.add("|---|---|---|---|")
    rows = [
        ("append of one event (`append_events`)", "append"),
        (f"full replay of a {REPLAY_EVENTS:,}-event run (SSE, to the end)", "full"),
        ("reconnect with `Last-Event-ID` = last - 100 (SSE, to the end)", "tail"),
    ]
    for label, key in rows:
        figures.add(
            f"| {label} | {stat_line(empty[key])} | {stat_line(full[key])} | "
            f"{med(full[key]) / med(empty[key]):.2f}x |"
        )
    figures.add(
        f"| EventWriter capacity (20,000 deltas, group commit) | "
        f"{med(empty['capacity']):,.0f} events/s | {med(full['capacity']):,.0f} events/s | "
        f"{med(full['capacity']) / med(empty['capacity']):.2f}x |"
    )
    figures.add("")
    figures.add(
        "Target: unchanged with 10 million rows (a ratio near 1.0 for times; the capacity "
        "ratio is a rate, so near 1.0 there too)."
    )
    return figures
