"""Claim latency against the queue's length, and against its runs' conversations' length.

10 queued runs against 100,000; and 10 queued runs, each after 1,000 finished runs of its
conversation.

The queue is seeded with SQL (conversations, input messages, queued runs) spread over 1,000
users of 10 tenants, with 50 runs already holding leases so that the per-user and per-tenant
limits have something to count. Each measured claim is the worker's own transaction (the
claim advisory lock, then `claim_next`, whose statement also stores `run.started`), committed
as a worker commits it. After each, outside the timing, the claimed run is put back in the
queue and its `run.started` deleted, so the queue keeps its length. A rolled-back claim
would also drop the connection's prepared statements, and with them the plan a worker's
claims reuse.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import psycopg

from bench.common import Figures, quantiles, run_async
from server.db.pool import Conn, migrate, open_pool
from server.process import setup_checkpointer
from server.runs.records import CLAIM_LOCK, claim_next
from server.runs.worker import claim_params
from server.settings import Settings

USERS = 1_000
TENANTS = 10
LEASED = 50
HISTORY = 1_000  # finished runs before each queued run, in its conversation


def seed(database_url: str, queued: int, history: int = 0) -> None:
    """Replace the database's runs with `queued` queued runs and `LEASED` leased ones.

    With `history`, each queued run's conversation has had that many runs before it, all
    finished (completed, failed or cancelled).
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE conversations CASCADE")
        total = queued + LEASED
        conn.execute(
            "INSERT INTO conversations (id, tenant_id, user_id)"
            " SELECT 'c' || i, 't' || (i %% %(t)s), 'u' || (i %% %(u)s)"
            " FROM generate_series(1, %(n)s) i",
            {"t": TENANTS, "u": USERS, "n": total},
        )
        conn.execute(
            "INSERT INTO messages (id, conversation_id, tenant_id, user_id, role, content)"
            " SELECT 'm' || i, 'c' || i, 't' || (i %% %(t)s), 'u' || (i %% %(u)s), 'user', 'go'"
            " FROM generate_series(1, %(n)s) i",
            {"t": TENANTS, "u": USERS, "n": total},
        )
        # Created a millisecond apart, oldest first, so the order of the queue is defined.
        conn.execute(
            "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
            " input_message_id, status, lease_owner, lease_expires_at, created_at)"
            " SELECT 'r' || i, 'c' || i, 't' || (i %% %(t)s), 'u' || (i %% %(u)s), 'scripted:x',"
            "  'm' || i, CASE WHEN i <= %(l)s THEN 'running' ELSE 'queued' END,"
            "  CASE WHEN i <= %(l)s THEN 'bench' END,"
            "  CASE WHEN i <= %(l)s THEN now() + interval '1 hour' END,"
            "  now() - interval '1 day' + i * interval '1 millisecond'"
            " FROM generate_series(1, %(n)s) i",
            {"t": TENANTS, "u": USERS, "n": total, "l": LEASED},
        )
        if history:
            conn.execute(
                "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
                " input_message_id, status, finished_at, created_at)"
                " SELECT 'r' || i || '_' || h, 'c' || i, 't' || (i %% %(t)s),"
                "  'u' || (i %% %(u)s), 'scripted:x', 'm' || i,"
                "  (ARRAY['completed', 'failed', 'cancelled'])[1 + h %% 3],"
                "  now() - interval '2 days' + h * interval '1 second',"
                "  now() - interval '2 days' + h * interval '1 second'"
                " FROM generate_series(%(l)s + 1, %(n)s) i, generate_series(1, %(h)s) h",
                {"t": TENANTS, "u": USERS, "n": total, "l": LEASED, "h": history},
            )
        conn.execute("VACUUM ANALYZE runs")


# The claimed run back as the seed made it: queued, no lease, no event.
_REQUEUE = """
UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,
    last_event_seq = 0, started_at = NULL
WHERE id = %(id)s
"""


async def claims(pool: Any, settings: Settings, count: int) -> list[float]:
    """Time `count` claims, each committed; return their durations in seconds."""
    params = claim_params(settings, "bench-worker")
    times: list[float] = []
    for _ in range(count):
        async with pool.connection() as conn:
            conn_: Conn = conn
            started = time.perf_counter()
            async with conn_.transaction():
                await conn_.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK,))
                claim = await claim_next(conn_, params)
            times.append(time.perf_counter() - started)
            if claim is None:
                raise RuntimeError("the seeded queue had nothing to claim")
            async with conn_.transaction():
                await conn_.execute(_REQUEUE, {"id": claim.run.id})
                await conn_.execute("DELETE FROM run_events WHERE run_id = %s", (claim.run.id,))
    return times


async def measure(database_url: str, quick: bool) -> dict[tuple[int, int], list[float]]:
    """Claim latencies at each queue length, and with each queued run's history."""
    settings = Settings(_env_file=None, DATABASE_URL=database_url)  # type: ignore[call-arg]
    out: dict[tuple[int, int], list[float]] = {}
    async with open_pool(database_url, settings) as pool:
        await migrate(pool)
        await setup_checkpointer(pool)  # as a worker's process does: the claim reads its table
        for queued, history in ((10, 0), (10_000 if quick else 100_000, 0), (10, HISTORY)):
            await asyncio.to_thread(seed, database_url, queued, history)
            await claims(pool, settings, 20)  # warm the prepared statement and the cache
            out[queued, history] = await claims(pool, settings, 50 if quick else 300)
    return out


def main(database_url: str, quick: bool) -> Figures:
    """Measure claim latency against the queue's length; return the figures."""
    latencies = run_async(measure(database_url, quick))
    fig = Figures("Claim latency against the queue's length", "python -m bench.run --only claim")
    fig.add(
        "One worker's claim (advisory lock + claim statement with its `run.started`,"
        " committed; then, untimed, the run is queued again), "
        f"{USERS:,} users in {TENANTS} tenants, {LEASED} runs holding leases; in"
        " process, on a pool."
    )
    fig.add("")
    fig.add("| queued runs | claim p50 | claim p95 | ratio to 10 queued | target |")
    fig.add("|---|---|---|---|---|")
    small = statistics.median(latencies[10, 0])
    for (queued, history), values in latencies.items():
        q = quantiles(values)
        ratio = q["p50"] / small
        if history:
            label = f"{queued:,}, each after {history:,} finished runs of its conversation"
            target = "context: flat as conversations grow"
        else:
            label = f"{queued:,}"
            target = "" if queued == 10 else f"≤ 2x {'**met**' if ratio <= 2 else '**missed**'}"
        fig.add(
            f"| {label} | {q['p50'] * 1e3:.2f} ms | {q['p95'] * 1e3:.2f} ms"
            f" | {ratio:.2f}x | {target} |"
        )
    return fig
