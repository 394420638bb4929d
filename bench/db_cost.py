"""Database cost per run: rows and bytes written per run, per table, and WAL per run.

The run of bench/overhead.py (one calculator call, a 20-chunk answer). The engine floor runs
the same graph first on the same database, so its cost (checkpoint tables only) is measured
the same way and is the baseline. Every table of the schema is counted, so ledger tables
(usage: issue 3, tools: issue 4) appear here once they exist. The WAL of each phase is read
with `pg_waldump`, this database's records only (autovacuum of the other benchmarks'
databases writes into the same WAL meanwhile), and broken down by record kind; the `runs`
row's updates are split into HOT ones (no index touched) and the others.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pgserver  # type: ignore[import-untyped]
import psycopg

from bench.client import Endpoint
from bench.common import Figures, env_for, processes, run_async, start_stack, write_scripts
from bench.engine import AGENT_SCRIPT, engine
from bench.overhead import agentrt_run, conversations

# Idle backends report their statistics at most this long after their last transaction.
STATS_SETTLE_S = 11.0


def wal_position(database_url: str) -> str:
    """The current WAL insert position."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _waldump(database_url: str, start: str, end: str, *args: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        # pg_waldump reads the files: wait until the WAL writer has flushed up to `end`.
        while conn.execute("SELECT pg_current_wal_flush_lsn() < %s::pg_lsn", (end,)).fetchone() != (
            False,
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the WAL was not flushed up to {end} within 30 s")
            time.sleep(0.05)
    folder = Path(parse_qs(urlsplit(database_url).query)["host"][0])
    waldump = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_waldump"
    out = subprocess.run(
        [str(waldump), *args, "-p", str(folder / "pg_wal"), "-s", start, "-e", end],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"pg_waldump failed: {out.stderr}")
    return out.stdout


def _database_oid(database_url: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT oid::text FROM pg_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return str(row[0])


def _records(database_url: str, start: str, end: str) -> list[tuple[str, int, int, str | None]]:
    """This database's WAL records between two positions.

    Each is (resource manager, record bytes, total bytes, the relfilenode it changes or None).
    Records that change another database's relations are left out: the cluster's WAL also
    holds what autovacuum does to the other benchmarks' databases meanwhile (full-page images
    of their pages, when it first sets their hint bits after a checkpoint).
    """
    return parse_records(_waldump(database_url, start, end), _database_oid(database_url))


def parse_records(text: str, database_oid: str) -> list[tuple[str, int, int, str | None]]:
    """Parse `pg_waldump` output, keeping records of database `database_oid` or of none."""
    found = []
    for line in text.splitlines():
        head = re.search(r"rmgr: (\w+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+)", line)
        if not head:
            continue
        rel = re.search(r"rel \d+/(\d+)/(\d+)", line)
        if rel and rel.group(1) not in (database_oid, "0"):
            continue  # another database's (0: a shared catalog, kept)
        found.append(
            (head.group(1), int(head.group(2)), int(head.group(3)), rel.group(2) if rel else None)
        )
    return found


def wal_by_table(database_url: str, start: str, end: str) -> dict[str, int]:
    """This database's WAL bytes between two positions by the table a record changes.

    A table's indexes and TOAST count for it, a partition for its partitioned table; records
    that change no relation (commits) count as "(no table)".
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        owners = dict(
            conn.execute(
                "SELECT c.relfilenode::text, coalesce(pp.relname, t.relname)"
                " FROM pg_class c"
                " LEFT JOIN pg_index i ON i.indexrelid = c.oid"
                " LEFT JOIN pg_class o ON o.reltoastrelid = coalesce(i.indrelid, c.oid)"
                " JOIN pg_class t ON t.oid = coalesce(o.oid, i.indrelid, c.oid)"
                " LEFT JOIN pg_inherits h ON h.inhrelid = t.oid AND t.relispartition"
                " LEFT JOIN pg_class pp ON pp.oid = h.inhparent"
                " WHERE c.relfilenode <> 0"
            ).fetchall()
        )
    found: dict[str, int] = {}
    for _, _, total, rel in _records(database_url, start, end):
        name = owners.get(rel, "(other relation)") if rel else "(no table)"
        found[name] = found.get(name, 0) + total
    return found


def wal_by_kind(database_url: str, start: str, end: str) -> dict[str, tuple[int, int]]:
    """This database's WAL bytes between two positions by resource manager.

    Each is (record bytes, full-page bytes): a record's bytes beyond its own are its images.
    """
    kinds: dict[str, tuple[int, int]] = {}
    for kind, record, total, _ in _records(database_url, start, end):
        rec, fpi = kinds.get(kind, (0, 0))
        kinds[kind] = (rec + record, fpi + total - record)
    return kinds


def runs_updates(database_url: str) -> tuple[int, int]:
    """Updates of `runs` rows so far: all, and HOT ones (that touched no index)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs'"
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def tables_state(database_url: str) -> tuple[dict[str, tuple[int, int, int]], int]:
    """Per table (rows, live bytes of the rows, bytes on disk with indexes); WAL position."""
    out: dict[str, tuple[int, int, int]] = {}
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        names = [
            r[0]
            for r in conn.execute(
                # A partitioned table counts once, for all its partitions.
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
                " AND NOT c.relispartition ORDER BY c.relname"
            ).fetchall()
        ]
        for name in names:
            row = conn.execute(
                f"SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0),"
                f" coalesce((SELECT sum(pg_total_relation_size(relid))"
                f" FROM pg_partition_tree('\"{name}\"')),"
                f' pg_total_relation_size(\'"{name}"\')) FROM "{name}" t'
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
        w0 = wal_position(database_url)
        run_async(engine_runs(database_url, runs))
        w1 = wal_position(database_url)
        # Read before the next CHECKPOINT, which may recycle these WAL segments.
        floor_kinds = wal_by_kind(database_url, w0, w1)
        s1 = tables_state(database_url)
        time.sleep(STATS_SETTLE_S)
        u1 = runs_updates(database_url)
        w2 = wal_position(database_url)
        run_async(agentrt_runs(ep, runs))
        w3 = wal_position(database_url)
        ours_kinds = wal_by_kind(database_url, w2, w3)
        ours_tables = wal_by_table(database_url, w2, w3)
        s2 = tables_state(database_url)
        time.sleep(STATS_SETTLE_S)
        u2 = runs_updates(database_url)
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
    # The target compares the records. Full-page images are the first change of each page
    # after a checkpoint: how many fall in a phase depends on when the checkpoints came.
    floor_dump = sum(rec for rec, _ in floor_kinds.values()) / runs
    ours_dump = sum(rec for rec, _ in ours_kinds.values()) / runs
    floor_fpi = sum(fpi for _, fpi in floor_kinds.values()) / runs
    ours_fpi = sum(fpi for _, fpi in ours_kinds.values()) / runs
    figures.add(
        f"WAL records written per run, this database's of each phase only (`pg_waldump`, "
        f"full-page images left out): engine {floor_dump / 1024:.1f} KiB, agentrt "
        f"{ours_dump / 1024:.1f} KiB: **{ours_dump / floor_dump:.2f}x** (target ≤ 1.5x: "
        f"{'**met**' if ours_dump <= 1.5 * floor_dump else '**missed**'}). Full-page images, "
        f"which depend on when checkpoints fell in each phase: engine {floor_fpi / 1024:.1f} "
        f"KiB, agentrt {ours_fpi / 1024:.1f} KiB. The WAL position's "
        f"advance over each phase, which also holds the statistics queries' hint-bit pages, "
        f"the processes' idle polls and other databases' autovacuum: engine "
        f"{floor_wal / 1024:.1f} KiB, agentrt "
        f"{ours_wal / 1024:.1f} KiB ({ours_wal / floor_wal:.2f}x)."
    )
    figures.add("")
    figures.add(
        "WAL per run by record kind (`pg_waldump` over each phase, this database's records; "
        "full pages are a record's bytes beyond its own, the images of the first change of "
        "each page after a checkpoint):"
    )
    figures.add("")
    figures.add(
        "| record kind | engine records | engine full pages | agentrt records | "
        "agentrt full pages |"
    )
    figures.add("|---|---|---|---|---|")
    for kind in sorted(ours_kinds, key=lambda k: -sum(ours_kinds[k])):
        ours, floor = ours_kinds[kind], floor_kinds.get(kind, (0, 0))
        if sum(ours) + sum(floor) < runs * 100:
            continue
        figures.add(
            f"| {kind} | {floor[0] / runs / 1024:.1f} KiB | {floor[1] / runs / 1024:.1f} KiB | "
            f"{ours[0] / runs / 1024:.1f} KiB | {ours[1] / runs / 1024:.1f} KiB |"
        )
    figures.add("")
    figures.add("agentrt's WAL per run by the table it changes (heap, TOAST and indexes):")
    figures.add("")
    figures.add("| table | WAL/run | share |")
    figures.add("|---|---|---|")
    whole = sum(ours_tables.values())
    for name, size in sorted(ours_tables.items(), key=lambda kv: -kv[1]):
        if size >= runs * 100:
            figures.add(f"| {name} | {size / runs / 1024:.1f} KiB | {size / whole:.0%} |")
    updates, hot = u2[0] - u1[0], u2[1] - u1[1]
    figures.add("")
    figures.add(
        f"`runs` row updates per run: {updates / runs:.1f}, of which HOT (no index entry "
        f"written) {hot / runs:.1f} ({hot / max(updates, 1):.0%})."
    )
    return figures
