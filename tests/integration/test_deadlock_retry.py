"""`retry_deadlocks` runs a transaction again after Postgres aborts it to break a deadlock."""

from __future__ import annotations

import asyncio

import pytest

from server.db.pool import Pool, retry_deadlocks

pytestmark = pytest.mark.timeout(60)


async def test_both_sides_of_a_real_deadlock_complete(pool: Pool) -> None:
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE deadlock_rows (id int PRIMARY KEY, n int NOT NULL)")
        await conn.execute("INSERT INTO deadlock_rows VALUES (1, 0), (2, 0)")
    holding = {1: asyncio.Event(), 2: asyncio.Event()}
    attempts = {1: 0, 2: 0}

    def side(first: int, second: int) -> object:
        async def attempt() -> None:
            attempts[first] += 1
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("UPDATE deadlock_rows SET n = n + 1 WHERE id = %s", (first,))
                if attempts[first] == 1:  # meet the other side only once, then run freely
                    holding[first].set()
                    await holding[second].wait()
                await conn.execute("UPDATE deadlock_rows SET n = n + 1 WHERE id = %s", (second,))

        return retry_deadlocks(attempt)

    await asyncio.gather(side(1, 2), side(2, 1))  # type: ignore[arg-type]

    async with pool.connection() as conn:
        cur = await conn.execute("SELECT n FROM deadlock_rows ORDER BY id")
        assert [r["n"] for r in await cur.fetchall()] == [2, 2]
    assert sorted(attempts.values()) == [1, 2]
