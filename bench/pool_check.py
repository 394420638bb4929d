"""What the pool's check costs per checkout: psycopg_pool's round trip against ours.

Each checkout is what our code does hundreds of times per run: take a pooled connection,
run one short statement, give it back. The two checks alternate in rounds on the same
Postgres, so a loaded machine slows both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from bench.common import Figures, postgres_cpu_seconds, run_async
from server.db.pool import Conn, check_connection, configure_connection, connection_kwargs

Check = Callable[[Any], Awaitable[None]]
CHECKS: dict[str, Check] = {
    "round trip (psycopg_pool `check_connection`)": AsyncConnectionPool.check_connection,
    "socket first (`server.db.pool.check_connection`)": check_connection,
}


async def checkouts(database_url: str, check: Check, count: int) -> tuple[float, float, float]:
    """Seconds of wall, of this process's CPU and of Postgres CPU per checkout."""
    pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
        database_url,
        min_size=2,
        max_size=2,
        kwargs=connection_kwargs(),
        configure=configure_connection,
        check=check,
        open=False,
    )
    await pool.open(wait=True)
    try:
        for _ in range(50):  # prepare the statement on both connections
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
        wall, cpu, pg = time.perf_counter(), time.process_time(), postgres_cpu_seconds(database_url)
        for _ in range(count):
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
        return (
            (time.perf_counter() - wall) / count,
            (time.process_time() - cpu) / count,
            (postgres_cpu_seconds(database_url) - pg) / count,
        )
    finally:
        await pool.close()


async def measure(database_url: str, rounds: int, count: int) -> dict[str, list[tuple[float, ...]]]:
    """Per check, one (wall, CPU, Postgres CPU) per round."""
    found: dict[str, list[tuple[float, ...]]] = {name: [] for name in CHECKS}
    for _ in range(rounds):
        for name, check in CHECKS.items():
            found[name].append(await checkouts(database_url, check, count))
    return found


def main(database_url: str, quick: bool) -> Figures:
    """Measure a checkout with each check; return the figures."""
    rounds, count = (2, 500) if quick else (5, 2000)
    found = run_async(measure(database_url, rounds, count))
    fig = Figures("Pool check per checkout", "python -m bench.run --only pool_check")
    fig.add(
        f"{rounds} rounds x {count:,} checkouts of one `SELECT 1` each, the two checks "
        "alternating; medians over the rounds."
    )
    fig.add("")
    fig.add("| check | wall per checkout | client CPU | Postgres CPU |")
    fig.add("|---|---|---|---|")
    for name, rows in found.items():
        wall, cpu, pg = (statistics.median(r[i] for r in rows) * 1e6 for i in range(3))
        fig.add(f"| {name} | {wall:.0f} µs | {cpu:.0f} µs | {pg:.0f} µs |")
    return fig
