"""The span sink stores what it collected: a run's few spans in one pipeline, a backlog by COPY."""

from __future__ import annotations

import asyncio
import json
import time

import psycopg
import pytest

from server.db.pool import Pool
from server.observability.metrics import Metrics
from server.observability.tracing import PostgresSpanSink, Tracing, read_attributes
from server.settings import Settings
from tests.support.rows import count_rows

pytestmark = pytest.mark.timeout(120)


def _tracing(pool: Pool, settings: Settings, keep_max: int = 50_000) -> Tracing:
    tracing = Tracing(pool, settings, Metrics())
    tracing.sink = PostgresSpanSink(pool, keep_max=keep_max)
    return tracing


def _spans(tracing: Tracing, run_id: str, count: int) -> None:
    for n in range(count):
        tracing.span(f"step {n}", tracing.root_of(run_id), {"agentrt.run_id": run_id}).end()


@pytest.mark.parametrize("count", [3, 200])
async def test_every_collected_span_and_payload_is_stored(
    pool: Pool, settings: Settings, count: int
) -> None:
    tracing = _tracing(pool, settings)
    sink = tracing.sink
    run_id = f"run_sink_{count}"
    root = tracing.span("run", tracing.root_of(run_id), {"agentrt.run_id": run_id})
    for n in range(count - 1):
        tracing.span(f"step {n}", root, {"agentrt.run_id": run_id}).end()
    root.end()
    trace_id, span_id = root.trace_id, root.span_id
    sink.add_payload(trace_id, span_id, "input", json.dumps({"text": "héllo", "n": 1}))
    sink.add_payload(trace_id, span_id, "input", json.dumps({"text": "a second copy is ignored"}))

    await sink.flush()
    await sink.flush()  # nothing left: a no-op

    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n, count(DISTINCT span_id) AS ids FROM trace_spans"
            " WHERE run_id = %s",
            (run_id,),
        )
        assert await cur.fetchone() == {"n": count, "ids": count}
        # Kept as the writer's compact JSON text (docs/decisions/2048), by either path.
        cur = await conn.execute(
            "SELECT spans IS NULL AS text_only, spans_text::text AS text FROM trace_span_sets"
            " WHERE run_id = %s",
            (run_id,),
        )
        for row in await cur.fetchall():
            assert row["text_only"] and row["text"] == json.dumps(
                json.loads(row["text"]), separators=(",", ":"), ensure_ascii=False
            )
        cur = await conn.execute(
            "SELECT data FROM trace_payloads WHERE trace_id = %s", (f"{trace_id:032x}",)
        )
        assert [r["data"] for r in await cur.fetchall()] == [{"text": "héllo", "n": 1}]


async def test_spans_whose_write_the_database_broke_off_are_written_by_the_next_flush(
    pool: Pool, settings: Settings
) -> None:
    tracing = _tracing(pool, settings)
    sink = tracing.sink
    _spans(tracing, "run_sink_retry", 3)
    async with pool.connection() as locker, locker.transaction():
        await locker.execute("LOCK TABLE trace_span_sets IN ACCESS EXCLUSIVE MODE")
        flushing = asyncio.ensure_future(sink.flush())
        async with pool.connection() as admin:
            async with asyncio.timeout(60):  # the flush waits for the lock; cancel its query
                while True:
                    cur = await admin.execute(
                        "SELECT pg_cancel_backend(pid) AS done FROM pg_locks"
                        " WHERE relation = 'trace_span_sets'::regclass AND NOT granted"
                    )
                    if await cur.fetchall():
                        break
                    await asyncio.sleep(0.02)
        with pytest.raises(psycopg.errors.QueryCanceled):
            await flushing
    assert await count_rows(pool, "trace_spans", "run_id", "run_sink_retry") == 0

    _spans(tracing, "run_sink_retry", 1)  # one more, collected after the failure
    await sink.flush()
    assert await count_rows(pool, "trace_spans", "run_id", "run_sink_retry") == 4


@pytest.mark.parametrize("count", [3, 200])
async def test_the_attributes_a_column_holds_are_stored_once_and_read_back(
    pool: Pool, settings: Settings, count: int
) -> None:
    # A statement for a few spans, COPY for a backlog: both store the run and tenant in their
    # columns only; reading puts them back among the attributes.
    tracing = _tracing(pool, settings)
    run_id = f"run_sink_columns_{count}"
    attributes = {"agentrt.run_id": run_id, "agentrt.tenant_id": "t1", "agentrt.step": 2}
    for n in range(count):
        tracing.span(f"step {n}", tracing.root_of(run_id), attributes).end()
    await tracing.sink.flush()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM trace_spans WHERE run_id = %s", (run_id,))
        rows = await cur.fetchall()
    assert len(rows) == count
    for row in rows:
        assert row["tenant_id"] == "t1"
        assert row["attributes"] == {"agentrt.step": 2}
        assert read_attributes(row) == attributes


async def test_a_span_holding_nul_characters_is_stored_with_them_replaced(
    pool: Pool, settings: Settings
) -> None:
    tracing = _tracing(pool, settings)
    sink = tracing.sink
    run_id = "run_sink_nul"
    span = tracing.span(
        "tool\x00call",
        tracing.root_of(run_id),
        {"agentrt.run_id": run_id, "agentrt.output": "a\x00b"},
    )
    span.add_event("retry", {"why": "\x00"})
    span.end()
    sink.add_payload(span.trace_id, span.span_id, "output", json.dumps({"text": ["\x00"]}))
    await sink.flush()
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT name, attributes ->> 'agentrt.output' AS output,"
            " events -> 0 -> 'attributes' ->> 'why' AS why FROM trace_spans WHERE run_id = %s",
            (run_id,),
        )
        assert await cur.fetchall() == [
            {"name": "tool\ufffdcall", "output": "a\ufffdb", "why": "\ufffd"}
        ]
        cur = await conn.execute(
            "SELECT data FROM trace_payloads WHERE trace_id = %s", (f"{span.trace_id:032x}",)
        )
        assert [r["data"] for r in await cur.fetchall()] == [{"text": ["\ufffd"]}]


async def test_spans_taken_into_a_transaction_are_written_with_it(
    pool: Pool, settings: Settings
) -> None:
    tracing = _tracing(pool, settings)
    sink = tracing.sink
    _spans(tracing, "run_sink_taken", 2)
    sink.add_payload(1, 2, "input", json.dumps({"text": "whole"}))
    batch = sink.take()
    async with pool.connection() as conn, conn.transaction():
        await batch.insert(conn)
        await conn.execute("SELECT 1")
    assert await count_rows(pool, "trace_spans", "run_id", "run_sink_taken") == 2
    assert not sink.take(), "what a batch took is the batch's alone"

    # A transaction that rolls back writes nothing; given back, the spans go with the next flush.
    _spans(tracing, "run_sink_rolled_back", 2)
    batch = sink.take()
    async with pool.connection() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await batch.insert(conn)
                raise RuntimeError("the run's final event was refused")
    assert await count_rows(pool, "trace_spans", "run_id", "run_sink_rolled_back") == 0
    sink.give_back(batch)
    await sink.flush()
    assert await count_rows(pool, "trace_spans", "run_id", "run_sink_rolled_back") == 2


async def test_spans_given_back_are_capped_whole_sets_oldest_first(
    pool: Pool, settings: Settings
) -> None:
    tracing = _tracing(pool, settings, keep_max=5)
    sink = tracing.sink
    _spans(tracing, "run_sink_capped_old", 4)
    sink.give_back(sink.take())
    _spans(tracing, "run_sink_capped", 3)
    sink.give_back(sink.take())  # 7 spans held: the older set (4) goes
    await sink.flush()
    assert await count_rows(pool, "trace_spans", "run_id", "run_sink_capped_old") == 0
    assert await count_rows(pool, "trace_spans", "run_id", "run_sink_capped") == 3


async def _sets(pool: Pool, run_id: str) -> list[int]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT span_count FROM trace_span_sets WHERE run_id = %s ORDER BY ended_at",
            (run_id,),
        )
        return [r["span_count"] for r in await cur.fetchall()]


async def test_a_take_for_one_trace_leaves_the_others_and_stores_it_in_one_row(
    pool: Pool, settings: Settings
) -> None:
    tracing = _tracing(pool, settings)
    sink = tracing.sink
    _spans(tracing, "run_sink_mine", 4)
    _spans(tracing, "run_sink_other", 2)
    _spans(tracing, "run_sink_mine", 3)
    async with pool.connection() as conn:
        await sink.take(tracing.root_of("run_sink_mine")[0]).insert(conn)
    assert await _sets(pool, "run_sink_mine") == [7]
    assert await _sets(pool, "run_sink_other") == []

    # The background flush leaves a trace whose spans ended less than `hold_s` ago.
    await sink.flush(settled=True)
    assert await _sets(pool, "run_sink_other") == []
    await sink.flush()
    assert await _sets(pool, "run_sink_other") == [2]


async def test_the_background_flush_stores_a_trace_once_its_spans_have_waited(
    pool: Pool, settings: Settings
) -> None:
    tracing = Tracing(pool, settings, Metrics())
    tracing.sink = PostgresSpanSink(pool, hold_s=0.0)
    _spans(tracing, "run_sink_settled", 2)
    await tracing.sink.flush(settled=True)
    assert await _sets(pool, "run_sink_settled") == [2]


async def test_a_set_written_again_after_a_commit_in_doubt_is_skipped(
    pool: Pool, settings: Settings
) -> None:
    tracing = _tracing(pool, settings)
    sink = tracing.sink
    _spans(tracing, "run_sink_twice", 3)
    batch = sink.take()
    async with pool.connection() as conn:
        await batch.insert(conn)
    sink.give_back(batch)  # as if the commit's answer had been lost
    _spans(tracing, "run_sink_twice", 1)
    await sink.flush()
    assert sorted(await _sets(pool, "run_sink_twice")) == [1, 3]
    assert await count_rows(pool, "trace_spans", "run_id", "run_sink_twice") == 4


async def test_a_backlog_of_sets_given_back_twice_goes_by_copy_then_by_insert(
    pool: Pool, settings: Settings
) -> None:
    # More sets than one statement takes go by COPY; a set already stored makes COPY fail
    # on its key, and the batch is inserted instead, skipping it.
    tracing = _tracing(pool, settings)
    sink = tracing.sink
    for n in range(80):
        _spans(tracing, f"run_sink_backlog_{n}", 1)
    batch = sink.take()
    async with pool.connection() as conn:
        await batch.insert(conn)
    sink.give_back(batch)
    await sink.flush()
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM trace_spans WHERE run_id LIKE 'run_sink_backlog_%'"
        )
        assert await cur.fetchone() == {"n": 80}


async def test_a_set_is_dated_by_its_latest_spans_end_not_its_roots_start(
    pool: Pool, settings: Settings
) -> None:
    # A run that waited 20 days (for an approval, say): its root span starts at its creation,
    # a day whose partition the span retention dropped long ago.
    tracing = _tracing(pool, settings)
    run_id = "run_sink_waited"
    created = time.time_ns() - 20 * 86_400 * 10**9
    root = tracing.span("run", tracing.root_of(run_id), {"agentrt.run_id": run_id}, created)
    tracing.span("step", root, {"agentrt.run_id": run_id}).end()
    root.end()
    await tracing.sink.flush()
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tableoid::regclass::text AS part, ended_at > now() - interval '1 hour' AS now,"
            " 'trace_span_sets_' || to_char(ended_at AT TIME ZONE 'UTC', 'YYYYMMDD') AS day"
            " FROM trace_span_sets WHERE run_id = %s",
            (run_id,),
        )
        stored = await cur.fetchall()
        cur = await conn.execute(
            "SELECT min(start_time) < now() - interval '19 days' AS old FROM trace_spans"
            " WHERE run_id = %s",
            (run_id,),
        )
        assert await cur.fetchone() == {"old": True}  # the spans keep their own times
    # In the day partition of its end (the default partition had caught it, and the next
    # retention pass deleted it).
    assert [(r["part"] == r["day"], r["now"]) for r in stored] == [(True, True)]


async def test_a_set_stored_as_jsonb_before_reads_as_one_stored_as_text(pool: Pool) -> None:
    """Rows written before the spans were kept as text keep `jsonb`; the view reads both."""
    spans = [
        {
            "span_id": "a1",
            "name": "run",
            "kind": "run",
            "start_time": "2026-12-05T10:00:00Z",
            "end_time": "2026-12-05T10:00:01Z",
            "duration_ms": 1000.5,
            "status": "ok",
            "attributes": {"agentrt.kind": "run", "n": 1e20},
        },
        {
            "span_id": "b2",
            "parent_span_id": "a1",
            "name": "tool x",
            "kind": "tool",
            "start_time": "2026-12-05T10:00:00.5Z",
            "end_time": "2026-12-05T10:00:00.75Z",
            "duration_ms": 250,
            "status": "error",
            "error": "boom",
            "events": [{"name": "e"}],
        },
    ]
    async with pool.connection() as conn:
        for column, trace in (("spans", "f" * 32), ("spans_text", "e" * 32)):
            await conn.execute(
                f"INSERT INTO trace_span_sets (trace_id, set_id, run_id, tenant_id, ended_at,"
                f" span_count, {column}) VALUES (%s, 's', 'run_forms', 't', now(), 2, %s)",
                (trace, json.dumps(spans)),
            )
        cur = await conn.execute(
            "SELECT trace_id, span_id, parent_span_id, name, kind, start_time, end_time,"
            " duration_ms, status, error, attributes, events FROM trace_spans"
            " WHERE run_id = 'run_forms' ORDER BY trace_id, span_id"
        )
        rows = await cur.fetchall()
        with pytest.raises(psycopg.errors.CheckViolation):  # one form, never both
            await conn.execute(
                "INSERT INTO trace_span_sets (trace_id, set_id, run_id, tenant_id, ended_at,"
                " span_count, spans, spans_text) VALUES ('d', 's', 'r', 't', now(), 1, '[]',"
                " '[]')"
            )
    text_form, jsonb_form = rows[:2], rows[2:]
    assert len(rows) == 4
    for a, b in zip(text_form, jsonb_form, strict=True):
        assert {**a, "trace_id": None} == {**b, "trace_id": None}
    assert jsonb_form[1]["events"] == [{"name": "e"}] and jsonb_form[0]["events"] == []
