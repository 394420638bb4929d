"""Idle cost: many runs parked in `waiting_user`; memory and CPU while they wait; resume time.

The runs are parked the way the approval node parks them, by storing `run.started` then
`approval.required` (the lease is released with the move to `waiting_user`); parking
thousands through real model turns would make the benchmark take minutes. What is measured
holds for any parked run: workers hold no slot and no memory for it, and the API and worker
idle loops do not grow with the count.
"Resume" here re-queues every parked run (`run.requeued`, the status change a decision
makes) and times until all have completed; the baseline is the engine floor running the
same number of runs at the same concurrency. Not yet measured: resuming through the
approval endpoint from a real interrupt checkpoint.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import psycopg

from bench.common import (
    Figures,
    Proc,
    env_for,
    met,
    postgres_cpu_seconds,
    processes,
    run_async,
    start_stack,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT, engine
from graphs.events import EventType
from server.db.pool import Pool, open_pool
from server.events.log import NewEvent, append_events
from server.ids import new_id
from server.settings import Settings

CONCURRENCY = 16


async def park(pool: Pool, count: int) -> list[str]:
    """Create `count` runs, each in its own conversation, parked in `waiting_user`."""
    ids: list[str] = []

    async def one() -> None:
        run_id, conv, msg = new_id("run"), new_id("conv"), new_id("msg")
        async with pool.connection() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO conversations (id, tenant_id, user_id) VALUES (%s, 'default', %s)",
                (conv, f"user{len(ids) % 50}"),
            )
            await conn.execute(
                "INSERT INTO messages (id, conversation_id, tenant_id, user_id, run_id, role,"
                " content) VALUES (%s, %s, 'default', 'u', %s, 'user', 'go')",
                (msg, conv, run_id),
            )
            await conn.execute(
                "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
                " input_message_id) VALUES (%s, %s, 'default', %s, 'scripted:bench', %s)",
                (run_id, conv, f"user{len(ids) % 50}", msg),
            )
            await append_events(
                conn,
                run_id,
                [
                    NewEvent(EventType.RUN_CREATED, {"conversationId": conv}),
                    NewEvent(EventType.RUN_STARTED, {"attempt": 0, "worker": "bench"}),
                    NewEvent(
                        EventType.APPROVAL_REQUIRED,
                        {
                            "approvalId": new_id("apr"),
                            "toolCallId": "call_1",
                            "name": "send_email",
                            "risk": "high",
                        },
                    ),
                ],
            )
        ids.append(run_id)

    gate = asyncio.Semaphore(8)

    async def gated() -> None:
        async with gate:
            await one()

    await asyncio.gather(*(gated() for _ in range(count)))
    return ids


def window(procs: list[Proc], database_url: str, seconds: float) -> tuple[float, float, float]:
    """CPU (% of a core) of API + workers and of Postgres over `seconds` of idling; RSS MiB."""
    cpu0, pg0 = sum(p.cpu_seconds() for p in procs), postgres_cpu_seconds(database_url)
    time.sleep(seconds)
    cpu = (sum(p.cpu_seconds() for p in procs) - cpu0) / seconds
    pg = (postgres_cpu_seconds(database_url) - pg0) / seconds
    return cpu * 100, pg * 100, sum(p.rss_mib() for p in procs)


async def resume(pool: Pool, ids: list[str], limit_s: float) -> float:
    """Re-queue the parked runs; return seconds until every one of them has completed."""
    started = time.perf_counter()
    for run_id in ids:
        async with pool.connection() as conn:
            await append_events(
                conn, run_id, [NewEvent(EventType.RUN_REQUEUED, {"reason": "approved"})]
            )
    async with asyncio.timeout(limit_s):
        while True:
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed') AS done,"
                    " count(*) FILTER (WHERE status IN ('failed', 'cancelled')) AS bad"
                    " FROM runs WHERE id = ANY(%s)",
                    (ids,),
                )
                row = await cur.fetchone()
            assert row is not None
            if row["bad"]:
                raise RuntimeError(f"{row['bad']} resumed runs did not complete")
            if row["done"] == len(ids):
                return time.perf_counter() - started
            await asyncio.sleep(0.05)


async def floor(database_url: str, runs: int) -> float:
    """Return the seconds the bare engine takes to run `runs` runs."""
    async with engine(database_url) as eng:
        await eng.throughput(5, 1)
        started = time.perf_counter()
        await eng.throughput(runs, CONCURRENCY)
        return time.perf_counter() - started


def active_slots(database_url: str) -> int:
    """Return how many worker slots are busy right now."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT coalesce(sum(active_runs), 0) FROM workers").fetchone()
    return int(row[0]) if row else 0


def main(database_url: str, quick: bool) -> Figures:
    """Measure what an idle run waiting for approval costs the workers."""
    figures = Figures("Idle cost of waiting runs", "make bench (bench/idle.py)")
    counts = [0, 1000] if quick else [0, 1000, 5000]
    seconds = 2.0 if quick else 10.0
    resumed = 50 if quick else 1000
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-idle-"))
    env = env_for(
        database_url,
        scripted_models_file=str(write_scripts(folder, {"bench": AGENT_SCRIPT})),
        user_max_active_runs=CONCURRENCY,
    )
    settings = Settings(database_url=database_url)
    procs = start_stack(env, workers=1, concurrency=CONCURRENCY)
    rows = []
    with processes(procs):

        async def scenario() -> tuple[float, float]:
            parked: list[str] = []
            async with open_pool(database_url, settings) as pool:
                for count in counts:
                    parked += await park(pool, count - len(parked))
                    await asyncio.sleep(1)  # let the claim loop and notifications settle
                    cpu, pg, rss = await asyncio.to_thread(window, procs, database_url, seconds)
                    rows.append((count, cpu, pg, rss, active_slots(database_url)))
                took = await resume(pool, parked[:resumed], 600)
            return took, await floor(database_url, resumed)

        took, base = run_async(scenario())
    figures.add(
        f"API process + one worker process (concurrency {CONCURRENCY}), idle for {seconds:.0f} s "
        "with N runs parked in `waiting_user` (see the module docstring for how they are "
        "parked)."
    )
    figures.add("")
    figures.add(
        "| runs waiting | API + worker CPU | Postgres CPU | API + worker RSS | worker slots held |"
    )
    figures.add("|---|---|---|---|---|")
    for count, cpu, pg, rss, slots in rows:
        figures.add(f"| {count:,} | {cpu:.1f}% | {pg:.1f}% | {rss:.0f} MiB | {slots} |")
    base_rss = rows[0][3]
    growth = rows[-1][3] - base_rss
    figures.add("")
    figures.add(
        f"Target: no worker slot held ({met(all(r[4] == 0 for r in rows))}), "
        f"no growth with the count: RSS {growth:+.0f} MiB from 0 to {counts[-1]:,} waiting runs, "
        "CPU within noise of the empty case (one claim query per poll, one heartbeat per "
        "third of the lease)."
    )
    figures.add("")
    figures.add(
        f"Resume {resumed:,} parked runs (re-queue all, until all completed): {took:.1f} s "
        f"({resumed / took:.1f} runs/s); the engine floor runs the same {resumed:,} runs at "
        f"concurrency {CONCURRENCY} in {base:.1f} s: **{took / base:.2f}x**. "
        "Not yet measured: resume through the approval endpoint from interrupt checkpoints."
    )
    return figures
