"""The typed Run against the real runs table."""

from __future__ import annotations

import dataclasses

from server.auth import Principal
from server.db.pool import Pool
from server.domain import Run, RunStatus
from server.runs.conversations import create_conversation
from server.runs.records import create_run, get_run

WHO = Principal("t1", "u1", frozenset({"reviewer"}))


async def test_the_run_record_has_every_column_of_the_runs_table(pool: Pool) -> None:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = 'runs'"
            # Columns Postgres computes from others (`phase`, from the status) are not data.
            " AND is_generated = 'NEVER'"
        )
        columns = {r["column_name"] for r in await cur.fetchall()}
    assert {f.name for f in dataclasses.fields(Run)} == columns


async def test_a_created_run_reads_back_as_a_queued_typed_run(pool: Pool) -> None:
    conv = await create_conversation(pool, WHO, None, None, {})
    created = await create_run(pool, WHO, conv["id"], "hello", "demo", {"maxSteps": 2})
    async with pool.connection() as conn:
        run = await get_run(conn, WHO, created.id)
    assert run == created
    assert run.status is RunStatus.QUEUED
    assert run.options == {"maxSteps": 2}
    assert run.principal_roles == ("reviewer",)
    assert run.last_event_seq == 1  # run.created
