"""Rows a test of the storage layer starts from, written straight to the tables."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool

from server.ids import new_id


async def insert_run(conn: AsyncConnection[Any]) -> str:
    """Insert a conversation and a queued run of it (tenant `t`, user `u`); return the run's id.

    The run has no events yet: the test appends them (`run.created` first).
    """
    run_id, conv = new_id("run"), new_id("conv")
    await conn.execute(
        "INSERT INTO conversations (id, tenant_id, user_id) VALUES (%s, 't', 'u')", (conv,)
    )
    await conn.execute(
        "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id)"
        " VALUES (%s, %s, 't', 'u', 'm', 'msg')",
        (run_id, conv),
    )
    return run_id


async def count_rows(pool: AsyncConnectionPool[Any], table: str, column: str, value: str) -> int:
    """Count the rows of `table` whose `column` is `value`."""
    query = sql.SQL("SELECT count(*) AS n FROM {} WHERE {} = %s").format(
        sql.Identifier(table), sql.Identifier(column)
    )
    async with pool.connection() as conn:
        cur = await conn.execute(query, (value,))
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])
