"""Dropping an old day of the event log beside live traffic: no deadlock, no unbounded stall.

The retention detaches and drops whole day partitions. These tests hold the locks a live
server holds (a transaction that has read `runs` and is about to write it, a reader of the
log) while the job runs, and check that both sides finish and nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
from datetime import date, timedelta
from typing import Any

import pytest

from server.db.pool import Pool
from server.lifecycle.retention import PARTITIONED, apply_retention, ensure_partitions
from server.settings import Settings

pytestmark = pytest.mark.timeout(120)


async def _scalar(pool: Pool, sql: str, *args: Any) -> Any:
    async with pool.connection() as conn:
        cur = await conn.execute(sql, args)
        row = await cur.fetchone()
        assert row is not None
        return next(iter(row.values()))


async def _run_with_events(pool: Pool, run_id: str, days_ago: int, events: int = 5) -> str:
    """A finished run that lived `days_ago` days ago, with its events in that day's partition.

    Returns the partition's name.
    """
    today: date = await _scalar(pool, "SELECT (now() AT TIME ZONE 'UTC')::date AS d")
    day = today - timedelta(days=days_ago)
    async with pool.connection() as conn:
        await conn.execute("SELECT agentrt_ensure_day_partitions('run_events', %s, %s)", (day, day))
        await conn.execute(
            "INSERT INTO conversations (id, tenant_id, user_id) VALUES (%s, 't', 'u')",
            (f"conv_{run_id}",),
        )
        at = f"{day.isoformat()}T12:00:00Z"
        await conn.execute(
            "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
            " input_message_id, status, created_at, updated_at, finished_at, last_event_seq)"
            " VALUES (%s, %s, 't', 'u', 'm', 'msg', 'completed', %s, %s, %s, %s)",
            (run_id, f"conv_{run_id}", at, at, at, events),
        )
        await conn.execute(
            "INSERT INTO run_events (run_id, seq, type, ts, data)"
            " SELECT %s, s, 'message.item.delta', %s::timestamptz + make_interval(secs => s),"
            " '{}' FROM generate_series(1, %s) s",
            (run_id, at, events),
        )
    return f"run_events_{day.strftime('%Y%m%d')}"


async def _exists(pool: Pool, table: str) -> bool:
    return bool(await _scalar(pool, "SELECT to_regclass(%s) IS NOT NULL AS ok", table))


async def _waits_for_a_lock(pool: Pool) -> bool:
    return bool(
        await _scalar(
            pool,
            "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE NOT l.granted AND d.datname = current_database()) AS waiting",
        )
    )


async def _until_done_or_waiting(pool: Pool, job: asyncio.Task[Any]) -> None:
    deadline = time.monotonic() + 60
    while not job.done() and not await _waits_for_a_lock(pool):
        assert time.monotonic() < deadline, "the retention neither finished nor waited"
        await asyncio.sleep(0.05)


async def test_dropping_a_day_beside_a_transaction_that_reads_then_writes_runs(
    pool: Pool, settings: Settings
) -> None:
    # A worker's transaction reads its run's row and writes it later, as the fenced
    # checkpoint and the tool ledger do. Dropping a partition that referenced `runs` needed an
    # ACCESS EXCLUSIVE lock on `runs`, behind this reader and ahead of its write: a deadlock.
    partition = await _run_with_events(pool, "run_old_a", days_ago=60)
    await _run_with_events(pool, "run_live_a", days_ago=0)

    async with pool.connection() as worker, worker.transaction():
        await worker.execute("SELECT status FROM runs WHERE id = 'run_live_a'")
        job = asyncio.create_task(apply_retention(pool, settings))
        await _until_done_or_waiting(pool, job)
        await worker.execute("UPDATE runs SET updated_at = now() WHERE id = 'run_live_a'")
    removed = await asyncio.wait_for(job, 60)

    assert removed is not None
    assert partition in removed.partitions_dropped
    assert not await _exists(pool, partition)
    assert await _scalar(pool, "SELECT count(*) FROM run_events WHERE run_id = 'run_old_a'") == 0
    assert await _scalar(pool, "SELECT count(*) FROM run_events WHERE run_id = 'run_live_a'") == 5


async def test_a_day_whose_table_is_held_is_left_for_the_next_pass(
    pool: Pool, settings: Settings
) -> None:
    partition = await _run_with_events(pool, "run_old_b", days_ago=61)
    quick = settings.model_copy(update={"retention_lock_timeout_s": 0.2})

    async with pool.connection() as reader, reader.transaction():
        # A long reader of the log (an export) holds the table: detaching would have to wait
        # for it, and every append would queue behind that wait.
        await reader.execute("SELECT count(*) FROM run_events")
        removed = await asyncio.wait_for(apply_retention(pool, quick), 60)
        assert removed is not None
        assert partition in removed.partitions_deferred
        assert partition not in removed.partitions_dropped
        # The job gave up its wait: appends go on.
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
                " input_message_id, status) VALUES ('run_new_b', 'conv_run_old_b', 't', 'u',"
                " 'm', 'msg', 'queued')"
            )
            await conn.execute(
                "INSERT INTO run_events (run_id, seq, type, data)"
                " VALUES ('run_new_b', 1, 'run.created', '{}')"
            )
    assert await _exists(pool, partition)
    assert await _scalar(pool, "SELECT count(*) FROM run_events WHERE run_id = 'run_old_b'") == 5

    again = await apply_retention(pool, quick)
    assert again is not None and partition in again.partitions_dropped
    assert not await _exists(pool, partition)
    assert await _scalar(pool, "SELECT count(*) FROM run_events WHERE run_id = 'run_new_b'") == 1


async def test_new_days_of_a_held_table_are_left_for_the_next_pass(pool: Pool) -> None:
    today: date = await _scalar(pool, "SELECT (now() AT TIME ZONE 'UTC')::date AS d")
    first = today + timedelta(days=40)
    names = [f"run_events_{(first + timedelta(days=d)).strftime('%Y%m%d')}" for d in (0, 1)]
    async with pool.connection() as reader, reader.transaction():
        await reader.execute("SELECT count(*) FROM run_events")
        async with pool.connection() as conn:
            made = await asyncio.wait_for(ensure_partitions(conn, first, 1, 0.2), 60)
        assert made == 4  # two days of spans and of payloads; the log's days wait
        assert not any([await _exists(pool, name) for name in names])
    async with pool.connection() as conn:
        assert await ensure_partitions(conn, first, 1, 0.2) == 2
    assert all([await _exists(pool, name) for name in names])


# The rows beside a run's log that go with the run by the same trigger, no foreign key.
_RUN_ROWS = (
    "INSERT INTO context_manifests (run_id, step, attempt, event_seq, tenant_id, manifest_text)"
    " VALUES (%(run)s, 1, 1, 2, 't', '{\"sections\": []}')",
    "INSERT INTO model_calls (id, run_id, event_seq, tenant_id, user_id, conversation_id, step,"
    " attempt, provider, model, model_id, requested_model, status, latency_ms)"
    " VALUES ('mc_' || %(run)s, %(run)s, 3, 't', 'u', 'conv_' || %(run)s, 1, 1, 'p', 'm', 'm',"
    " 'm', 'ok', 1.5)",
    "INSERT INTO run_snapshots (run_id, seq, snapshot_text) VALUES (%(run)s, 5, '{}')",
)


async def test_a_deleted_run_takes_its_events_with_it(pool: Pool) -> None:
    """And its manifests, model calls and snapshot (docs/decisions/2002, 2047)."""
    for run_id in ("run_gone_c", "run_gone_d", "run_kept_e"):
        await _run_with_events(pool, run_id, days_ago=0)
        async with pool.connection() as conn:
            for insert in _RUN_ROWS:
                await conn.execute(insert, {"run": run_id})
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM runs WHERE id = 'run_gone_c'")
        # Through the conversation's cascade, as deleting a LangGraph thread does.
        await conn.execute("DELETE FROM conversations WHERE id = 'conv_run_gone_d'")

    for run_id, left in (("run_gone_c", 0), ("run_gone_d", 0), ("run_kept_e", 5)):
        sql = "SELECT count(*) FROM run_events WHERE run_id = %s"
        assert await _scalar(pool, sql, run_id) == left, run_id
        for table in ("context_manifests", "model_calls", "run_snapshots"):
            sql = f"SELECT count(*) FROM {table} WHERE run_id = %s"
            assert await _scalar(pool, sql, run_id) == min(left, 1), (table, run_id)


async def test_spans_and_payloads_the_default_partitions_caught_go_by_their_dates(
    pool: Pool, settings: Settings
) -> None:
    # Days without a partition of their own (the job did not run for weeks): their span sets
    # and payloads went to the default partitions, which the job trims by each row's date.
    async with pool.connection() as conn:
        for days_ago, trace in ((40, "old"), (3, "recent")):
            await conn.execute(
                "INSERT INTO trace_span_sets (trace_id, set_id, run_id, tenant_id, ended_at,"
                " span_count, spans) VALUES (%s, 's1', 'run_x', 't',"
                " now() - make_interval(days => %s), 3, '[{}, {}, {}]')",
                (trace, days_ago),
            )
            await conn.execute(
                "INSERT INTO trace_payloads (trace_id, span_id, kind, data, created_at)"
                " VALUES (%s, 'p1', 'input', '{}', now() - make_interval(days => %s))",
                (trace, days_ago),
            )
    caught = "SELECT count(*) AS n FROM {}_default WHERE trace_id = %s"
    for table in ("trace_span_sets", "trace_payloads"):
        for trace in ("old", "recent"):
            assert await _scalar(pool, caught.format(table), trace) == 1

    removed = await apply_retention(pool, settings)  # spans are kept 14 days

    assert removed is not None
    assert (removed.spans, removed.payloads) == (3, 1)  # a set counts its spans
    for table in ("trace_span_sets", "trace_payloads"):
        assert await _scalar(pool, caught.format(table), "old") == 0
        assert await _scalar(pool, caught.format(table), "recent") == 1


async def test_the_retention_knows_every_daily_table_and_its_partition_key(pool: Pool) -> None:
    # A table partitioned by day that the retention does not list would grow for ever.
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT c.relname AS name, pg_get_partkeydef(c.oid) AS key FROM pg_class c"
            " WHERE c.relkind = 'p' AND c.relnamespace = current_schema()::regnamespace"
        )
        found = {r["name"]: r["key"] for r in await cur.fetchall()}
    assert found == {table: f"RANGE ({d.dated_by})" for table, d in PARTITIONED.items()}
