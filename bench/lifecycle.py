"""Data lifecycle: the partitioned event log against a fresh one, dropping a day, migrating.

1. Append and replay on a fresh (empty) log, then again once the log holds `total` events in
   30 daily partitions (one of them, the oldest, holding `day` events): both through the
   server's own code (`append_events`, `read_events`).
2. The retention job drops that oldest day: its time, and dead tuples afterwards
   (`pg_stat_user_tables`), against a `DELETE` of as many rows in a plain table.
3. Migration 0019 converting an unpartitioned log of `migrate_rows` events.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from bench.common import Figures, database_url_for, run_async, stat_line
from graphs.events import EventType
from server.db.pool import migrate, open_pool
from server.events.log import NewEvent, append_events, load_head, read_events
from server.lifecycle.retention import apply_retention
from server.settings import Settings

MIGRATIONS = Path(__file__).resolve().parents[1] / "server" / "db" / "migrations"
RUNS_PER_DAY = 100
DAYS = 30


def _settings(url: str) -> Settings:
    return Settings(_env_file=None, DATABASE_URL=url, event_retention_days=DAYS)  # type: ignore[call-arg]


def _add_runs(conn: psycopg.Connection, day: int, now: datetime, events_per_run: int) -> None:
    """RUNS_PER_DAY ended runs `day` days ago, each with `events_per_run` events that day."""
    start = now - timedelta(days=day)
    conn.execute(
        "INSERT INTO conversations (id, tenant_id, user_id) VALUES (%s, 't', 'u')"
        " ON CONFLICT DO NOTHING",
        (f"conv_{day}",),
    )
    conn.execute(
        "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id,"
        " status, created_at, finished_at, updated_at, last_event_seq)"
        " SELECT 'run_' || %(day)s || '_' || r, %(conv)s, 't', 'u', 'm', 'msg', 'completed',"
        " %(start)s, %(start)s + interval '1 hour', %(start)s + interval '1 hour', %(n)s"
        " FROM generate_series(1, %(runs)s) r",
        {
            "day": day,
            "conv": f"conv_{day}",
            "start": start,
            "n": events_per_run,
            "runs": RUNS_PER_DAY,
        },
    )
    conn.execute(
        "INSERT INTO run_events (run_id, seq, type, ts, attempt, data)"
        " SELECT 'run_' || %(day)s || '_' || r, s, 'message.item.delta',"
        " %(start)s + make_interval(secs => s * 0.01), 1,"
        " jsonb_build_object('itemId', 'i', 'delta', 'some words ' || s)"
        " FROM generate_series(1, %(runs)s) r, generate_series(1, %(n)s) s",
        {"day": day, "start": start, "n": events_per_run, "runs": RUNS_PER_DAY},
    )


async def _append_and_replay(
    url: str, appends: int, replays: int
) -> tuple[list[float], list[float]]:
    """Seconds per append of one event to a live run, and per replay of a 2,000-event run."""
    settings = _settings(url)
    async with open_pool(url, settings) as pool, pool.connection() as conn:
        run_id = f"run_live_{time.monotonic_ns()}"
        await conn.execute(
            "INSERT INTO conversations (id, tenant_id, user_id) VALUES (%s, 't', 'u')",
            (run_id,),
        )
        await conn.execute(
            "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
            " input_message_id) VALUES (%s, %s, 't', 'u', 'm', 'msg')",
            (run_id, run_id),
        )
        head, _ = await append_events(conn, run_id, [NewEvent(EventType.RUN_CREATED, {})])
        head, _ = await append_events(
            conn, run_id, [NewEvent(EventType.RUN_STARTED, {"attempt": 1})], head=head
        )
        append_s = []
        for i in range(appends):
            began = time.perf_counter()
            head, _ = await append_events(
                conn,
                run_id,
                [NewEvent(EventType.MESSAGE_ITEM_DELTA, {"itemId": "i", "delta": f"w{i} "})],
                head=head,
            )
            append_s.append(time.perf_counter() - began)
        head = await load_head(conn, run_id, lock=False)
        replay_s = []
        for _ in range(replays):
            began = time.perf_counter()
            rows = await read_events(conn, run_id, 0, 5000)
            replay_s.append(time.perf_counter() - began)
        assert len(rows) == head.seq
    return append_s, replay_s


def _dead_tuples(conn: psycopg.Connection, pattern: str) -> int:
    row = conn.execute(
        "SELECT COALESCE(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname LIKE %s",
        (pattern,),
    ).fetchone()
    return int(row[0]) if row else 0


async def _retention(url: str, now: datetime) -> tuple[float, int, list[str]]:
    settings = _settings(url)
    async with open_pool(url, settings) as pool:
        began = time.perf_counter()
        removed = await apply_retention(pool, settings, now=now)
        took = time.perf_counter() - began
    assert removed is not None
    return took, removed.events, removed.partitions_dropped


def _migration(server_url: str, rows: int) -> float:
    """Seconds for migration 0019 on a log of `rows` events (schema at 0018)."""
    url = database_url_for(server_url, "bench_lifecycle_migrate")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for path in sorted(MIGRATIONS.glob("*.sql")):
            version = int(path.name.split("_", 1)[0])
            if version < 19:
                with conn.transaction():
                    conn.execute(path.read_text().encode())
                    conn.execute(
                        "INSERT INTO schema_migrations VALUES (%s, %s)", (version, path.name)
                    )
            elif version > 19:  # marked done, so that only 0019 is applied and timed
                conn.execute("INSERT INTO schema_migrations VALUES (%s, %s)", (version, path.name))
        now = datetime.now(UTC)
        per_day = rows // DAYS
        for day in range(DAYS):
            _add_runs(conn, day, now, per_day // RUNS_PER_DAY)
        conn.execute("VACUUM ANALYZE")

    async def run() -> float:
        async with open_pool(url, _settings(url)) as pool:
            began = time.perf_counter()
            applied = await migrate(pool)
            assert applied == ["0019_partitions.sql"], applied
            return time.perf_counter() - began

    took: float = run_async(run())
    with psycopg.connect(url) as conn:
        count = conn.execute("SELECT count(*) FROM run_events").fetchone()
    assert count is not None and count[0] == (rows // DAYS // RUNS_PER_DAY) * RUNS_PER_DAY * DAYS
    return took


def _delete_comparison(conn: psycopg.Connection, rows: int) -> tuple[float, int]:
    """A DELETE of `rows` rows from a plain table: seconds, dead tuples left."""
    conn.execute("CREATE TABLE bench_plain (LIKE run_events INCLUDING DEFAULTS)")
    conn.execute("ALTER TABLE bench_plain ADD PRIMARY KEY (run_id, seq, ts)")
    conn.execute("INSERT INTO bench_plain SELECT * FROM run_events LIMIT %s", (rows,))
    conn.execute("ANALYZE bench_plain")
    began = time.perf_counter()
    conn.execute("DELETE FROM bench_plain")
    took = time.perf_counter() - began
    time.sleep(1)  # statistics are reported by the backend when idle
    conn.execute("SELECT pg_stat_force_next_flush()")
    return took, _dead_tuples(conn, "bench_plain")


def main(database_url: str, quick: bool) -> Figures:
    """Measure the partitioned event log and the retention job."""
    figures = Figures("Data lifecycle: partitioned event log", "make bench (bench/lifecycle.py)")
    total = 300_000 if quick else 10_000_000
    day_rows = 100_000 if quick else 1_000_000
    migrate_rows = 100_000 if quick else 1_000_000
    appends, replays = (300, 20) if quick else (2000, 50)
    settings = _settings(database_url)

    async def setup() -> None:
        async with open_pool(database_url, settings) as pool:
            await migrate(pool)

    run_async(setup())
    fresh_append, fresh_replay = run_async(_append_and_replay(database_url, appends, replays))

    now = datetime.now(UTC)
    began = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "SELECT agentrt_ensure_day_partitions('run_events', %s, %s)",
            ((now - timedelta(days=DAYS - 1)).date(), now.date()),
        )
        oldest = DAYS - 1
        _add_runs(conn, oldest, now, day_rows // RUNS_PER_DAY)
        per_day = (total - day_rows) // (DAYS - 1) // RUNS_PER_DAY
        for day in range(DAYS - 1):
            _add_runs(conn, day, now, per_day)
        conn.execute("VACUUM ANALYZE")
        stored = conn.execute("SELECT count(*) FROM run_events").fetchone()
        assert stored is not None
    filled_s = time.perf_counter() - began
    full_append, full_replay = run_async(_append_and_replay(database_url, appends, replays))

    figures.add(
        f"- log: {stored[0]:,} events in {DAYS} daily partitions (filled in {filled_s:.0f} s)"
    )
    figures.add(f"- append of one event, fresh log: {stat_line(fresh_append)}")
    figures.add(f"- append of one event, {stored[0]:,}-event log: {stat_line(full_append)}")
    figures.add(f"- replay of a {appends + 2}-event run, fresh log: {stat_line(fresh_replay)}")
    figures.add(
        f"- replay of a {appends + 2}-event run, {stored[0]:,}-event log: {stat_line(full_replay)}"
    )

    # The job's clock two days on: the oldest day (ended runs only) is past the retention.
    took, events, dropped = run_async(_retention(database_url, now + timedelta(days=2)))
    with psycopg.connect(database_url, autocommit=True) as conn:
        time.sleep(1)
        conn.execute("SELECT pg_stat_force_next_flush()")
        dead = _dead_tuples(conn, "run_events%")
        delete_s, delete_dead = _delete_comparison(conn, day_rows)
    figures.add(
        f"- retention dropping a day of {events:,} events ({', '.join(dropped)}): "
        f"{took * 1000:.0f} ms; dead tuples left in run_events partitions: {dead:,}"
    )
    figures.add(
        f"- for comparison, DELETE of {day_rows:,} rows from a plain table: "
        f"{delete_s * 1000:.0f} ms, {delete_dead:,} dead tuples left for VACUUM"
    )
    figures.add(
        f"- migration 0019 on an unpartitioned log of {migrate_rows:,} events: "
        f"{_migration(database_url, migrate_rows):.1f} s"
    )
    return figures
