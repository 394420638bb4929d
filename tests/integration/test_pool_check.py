"""The pool's check before a checkout: silent for a healthy connection, strict for a dead one."""

from __future__ import annotations

import asyncio
import os
import tempfile

from psycopg import AsyncConnection

from server.db.pool import Pool, check_connection, connection_kwargs, open_pool
from server.settings import Settings


async def test_a_healthy_idle_connection_is_checked_without_a_round_trip(pool: Pool) -> None:
    async with pool.connection() as conn:
        await conn.execute("SELECT 1")
        with tempfile.TemporaryFile() as trace:
            conn.pgconn.trace(trace.fileno())
            try:
                await check_connection(conn)
            finally:
                conn.pgconn.untrace()
            trace.seek(0)
            assert trace.read() == b""


async def test_a_connection_whose_backend_ended_is_not_handed_out(pool: Pool) -> None:
    async with pool.connection() as conn:
        doomed = (await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone())["pid"]  # type: ignore[index]
    async with pool.connection() as other:
        if (await (await other.execute("SELECT pg_backend_pid() AS pid")).fetchone())[
            "pid"
        ] == doomed:  # type: ignore[index]
            raise AssertionError("the pool handed out the same connection twice at once")
        await other.execute("SELECT pg_terminate_backend(%s)", (doomed,))
        async with asyncio.timeout(30):  # the backend exits a moment after the signal
            while True:
                cur = await other.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (doomed,)
                )
                if await cur.fetchone() is None:
                    break
                await asyncio.sleep(0.05)
    # Every connection the pool hands out now works, the dead one included before.
    for _ in range(pool.get_stats()["pool_size"] + 1):
        async with pool.connection() as conn:
            assert (await (await conn.execute("SELECT 1 AS one")).fetchone()) == {"one": 1}


async def test_a_connection_with_a_descriptor_above_1023_is_checked(database_url: str) -> None:
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        conn = await AsyncConnection.connect(database_url, **connection_kwargs())
        async with conn:
            assert conn.fileno() > 1023
            await check_connection(conn)
    finally:
        for fd in filler:
            os.close(fd)


async def test_after_every_pooled_connection_dies_the_next_checkout_gets_a_live_one(
    settings: Settings, database_url: str
) -> None:
    # As after a Postgres restart: all eight idle connections are dead at once. psycopg_pool
    # alone tries them one by one, 1, 2, 4 s apart, and this checkout timed out after 6 s.
    quick = settings.model_copy(update={"db_pool_min": 8, "db_pool_timeout_s": 6.0})
    async with open_pool(database_url, quick) as pool:
        held = [await pool.getconn() for _ in range(8)]
        pids = [
            (await (await c.execute("SELECT pg_backend_pid() AS pid")).fetchone())["pid"]  # type: ignore[index]
            for c in held
        ]
        for c in held:
            await pool.putconn(c)
        async with await AsyncConnection.connect(database_url, **connection_kwargs()) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) AS p", (pids,)
            )
            async with asyncio.timeout(30):  # the backends exit a moment after the signal
                while True:
                    cur = await admin.execute(
                        "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
                    )
                    if (await cur.fetchone())["n"] == 0:  # type: ignore[index]
                        break
                    await asyncio.sleep(0.05)
        assert pool.get_stats()["pool_available"] == 8
        async with pool.connection() as conn:
            assert (await (await conn.execute("SELECT 1 AS one")).fetchone()) == {"one": 1}
        # The sweep replaced the other dead ones too: every idle connection works.
        for _ in range(8):
            async with pool.connection(timeout=2) as conn:
                assert (await (await conn.execute("SELECT 1 AS one")).fetchone()) == {"one": 1}
