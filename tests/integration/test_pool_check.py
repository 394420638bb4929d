"""The pool's check before a checkout: silent for a healthy connection, strict for a dead one."""

from __future__ import annotations

import asyncio
import os
import tempfile

from psycopg import AsyncConnection

from server.db.pool import Pool, check_connection, connection_kwargs


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
