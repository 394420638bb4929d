"""Database cost per run: rows and bytes written per run, per table, and WAL per run.

The run of bench/overhead.py (one calculator call, a 20-chunk answer). The engine floor runs
the same graph first on the same database, so its cost (checkpoint tables only) is measured
the same way and is the baseline. Every table of the schema is counted, so ledger tables
(usage: issue 3, tools: issue 4) appear here once they exist.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import psycopg

from bench.client import Endpoint
from bench.common import Figures, env_for, processes, run_async, start_stack, write_scripts
from bench.engine import AGENT_SCRIPT, engine
from bench.overhead import agentrt_run, conversations


def tables_state(database_url: str) -> tuple[dict[str, tuple[int, int, int]], int]:
    """Per table (rows, live bytes of the rows, bytes on disk with indexes); WAL position."""
    out: dict[str, tuple[int, int, int]] = {}
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        names = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
            ).fetchall()
        ]
        for name in names:
            row = conn.execute(
                f"SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0),"
                f' pg_total_relation_size(\'"{name}"\') FROM "{name}" t'
            ).fetchone()
            assert row is not None
            out[name] = (int(row[0]), int(row[1]), int(row[2]))
        wal = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert wal is not None
    return out, int(wal[0])


def delta(
    before: tuple[dict[str, tuple[int, int, int]], int],
    after: tuple[dict[str, tuple[int, int, int]], int],
    runs: int,
) -> tuple[dict[str, tuple[float, float, float]], float]:
    """Return the per-run difference between two statistics snapshots."""
    rows = {
        name: tuple(
            (a - b) / runs
            for a, b in zip(after[0][name], before[0].get(name, (0, 0, 0)), strict=True)
        )
        for name in after[0]
    }
    return rows, (after[1] - before[1]) / runs  # type: ignore[return-value]


async def engine_runs(database_url: str, runs: int) -> None:
    """Drive `runs` runs through the bare engine one after another."""
    async with engine(database_url) as eng:
        await eng.throughput(runs, 1)


async def agentrt_runs(ep: Endpoint, runs: int) -> None:
    """Drive `runs` runs through agentrt's API one after another."""
    for conv in await conversations(ep, runs):
        await agentrt_run(ep, conv)


def main(database_url: str, quick: bool) -> Figures:
    """Measure row writes, WAL bytes and Postgres CPU per run."""
    figures = Figures("Database cost per run", "make bench (bench/db_cost.py)")
    runs = 30 if quick else 200
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-db-"))
    env = env_for(
        database_url, scripted_models_file=str(write_scripts(folder, {"bench": AGENT_SCRIPT}))
    )
    procs = start_stack(env, workers=1)
    assert procs[0].url is not None
    ep = Endpoint.of(procs[0].url)
    with processes(procs):
        run_async(engine_runs(database_url, 3))
        run_async(agentrt_runs(ep, 3))  # warm up; tables exist
        s0 = tables_state(database_url)
        run_async(engine_runs(database_url, runs))
        s1 = tables_state(database_url)
        run_async(agentrt_runs(ep, runs))
        s2 = tables_state(database_url)
    floor_rows, floor_wal = delta(s0, s1, runs)
    ours_rows, ours_wal = delta(s1, s2, runs)
    figures.add(
        f"{runs} runs each, one at a time; conversation creation included for agentrt (one row). "
        "Bytes of rows are `pg_column_size` of the live rows (TOAST-compressed as stored); "
        "on disk is `pg_total_relation_size` (heap, TOAST, indexes; grows by pages, and "
        "includes dead row versions left by updates)."
    )
    figures.add("")
    figures.add(
        "| table | engine rows/run | agentrt rows/run | agentrt row bytes/run"
        " | agentrt on disk/run |"
    )
    figures.add("|---|---|---|---|---|")
    total_rows = total_bytes = 0.0
    for name in sorted(ours_rows, key=lambda n: -ours_rows[n][2]):
        if name in ("schema_migrations", "checkpoint_migrations"):
            continue
        r, b, d = ours_rows[name]
        if not (r or d):
            continue
        total_rows, total_bytes = total_rows + r, total_bytes + b
        figures.add(
            f"| {name} | {floor_rows[name][0]:.1f} | {r:.1f} | {b / 1024:.1f} KiB | "
            f"{d / 1024:.1f} KiB |"
        )
    figures.add(f"| **all** | | {total_rows:.1f} | {total_bytes / 1024:.1f} KiB | |")
    figures.add("")
    figures.add(
        f"WAL written per run: engine {floor_wal / 1024:.1f} KiB, agentrt {ours_wal / 1024:.1f} "
        f"KiB: **{ours_wal / floor_wal:.2f}x**. No target was set; the log and the snapshot "
        "(rewritten with each event batch), the trace and the two ledgers are what agentrt "
        "adds."
    )
    return figures
