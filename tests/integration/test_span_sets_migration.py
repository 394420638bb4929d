"""Migrating the span rows to sets keeps every span, as `trace_spans` read it before."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from server.db.pool import migrate, open_pool
from server.settings import Settings
from tests.support.postgres import create_database, drop_database, migrate_before

pytestmark = pytest.mark.timeout(180)
SETS = 41


@pytest.fixture
def old_database(pg_admin_url: str) -> Iterator[str]:
    """A database before the span sets, with spans of two traces over three days."""
    url = create_database(pg_admin_url)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate_before(conn, SETS)
        spans = [
            # trace, span, parent, run, days ago, error, attributes, events
            ("t1", "a", None, "run_1", 2, None, '{"agentrt.step": 1}', "[]"),
            (
                "t1",
                "b",
                "a",
                "run_1",
                2,
                "boom",
                '{"agentrt.input": "{\\"q\\": 1}"}',
                '[{"name": "retry", "ts": "2026-01-01T00:00:00+00:00", "attributes": {}}]',
            ),
            ("t1", "c", "a", "run_1", 1, None, "{}", "[]"),
            ("t2", "a", None, None, 0, None, '{"k": [1, 2.5, null]}', "[]"),
        ]
        for trace, span, parent, run, days, error, attributes, events in spans:
            conn.execute(
                "INSERT INTO trace_spans (trace_id, span_id, parent_span_id, run_id, tenant_id,"
                " name, kind, start_time, end_time, duration_ms, status, error, attributes,"
                " events) VALUES (%s, %s, %s, %s, 't', 'step ' || %s, 'node',"
                " now() - make_interval(days => %s),"
                " now() - make_interval(days => %s) + interval '1.234567 ms', 1.234567,"
                " CASE WHEN %s::text IS NULL THEN 'unset' ELSE 'error' END, %s, %s, %s)",
                (trace, span, parent, run, span, days, days, error, error, attributes, events),
            )
    yield url
    drop_database(pg_admin_url, url)


def _spans(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT trace_id, span_id, parent_span_id, run_id, tenant_id, name, kind,"
            " start_time, end_time, duration_ms, status, error, attributes, events"
            " FROM trace_spans ORDER BY trace_id, span_id"
        ).fetchall()


async def test_every_span_reads_back_the_same_one_set_per_trace_and_day(
    old_database: str, settings: Settings
) -> None:
    before = _spans(old_database)
    assert len(before) == 4

    async with open_pool(old_database, settings) as pool:
        applied = await migrate(pool)
    assert applied[0] == "0041_span_sets.sql"

    assert _spans(old_database) == before
    with psycopg.connect(old_database) as conn:
        sets = conn.execute(
            "SELECT trace_id, span_count FROM trace_span_sets ORDER BY trace_id, ended_at"
        ).fetchall()
        assert sets == [("t1", 2), ("t1", 1), ("t2", 1)]
        in_default = conn.execute("SELECT count(*) FROM trace_span_sets_default").fetchone()
        assert in_default == (0,)  # each set in its day's partition
