"""The partitioning migration converts an existing event log without losing an event."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from server.db.pool import migrate, open_pool
from server.settings import Settings
from tests.support.postgres import create_database, drop_database, migrate_before

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def old_database(pg_admin_url: str) -> Iterator[str]:
    """A database at migration 0018 (before partitioning), with a log spread over ten days."""
    url = create_database(pg_admin_url)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate_before(conn, 19)
        conn.execute(
            "INSERT INTO conversations (id, tenant_id, user_id) VALUES ('conv_1', 't', 'u')"
        )
        for r in range(10):
            conn.execute(
                "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
                " input_message_id, status, created_at, last_event_seq)"
                " VALUES (%s, 'conv_1', 't', 'u', 'm', 'msg', 'completed',"
                " now() - make_interval(days => %s), 500)",
                (f"run_{r}", r),
            )
            conn.execute(
                "INSERT INTO run_events (run_id, seq, type, ts, data)"
                " SELECT %s, s, 'message.item.delta',"
                " now() - make_interval(days => %s) + make_interval(secs => s),"
                " jsonb_build_object('delta', 'x' || s) FROM generate_series(1, 500) s",
                (f"run_{r}", r),
            )
            conn.execute(
                "INSERT INTO trace_spans (trace_id, span_id, run_id, name, kind, start_time,"
                " end_time, duration_ms, status) VALUES (%s, 'a', %s, 'run', 'internal',"
                " now() - make_interval(days => %s), now(), 1, 'ok')",
                (f"trace{r}", f"run_{r}", r),
            )
            conn.execute(
                "INSERT INTO trace_payloads (trace_id, span_id, kind, data)"
                " VALUES (%s, 'a', 'input', '{\"q\": 1}')",
                (f"trace{r}",),
            )
    yield url
    drop_database(pg_admin_url, url)


def _dump(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT run_id, seq, type, ts, attempt, data FROM run_events ORDER BY run_id, seq"
        ).fetchall()


async def test_the_migration_keeps_every_event_in_daily_partitions(
    old_database: str, settings: Settings
) -> None:
    before = _dump(old_database)
    assert len(before) == 5000

    async with open_pool(old_database, settings) as pool:
        applied = await migrate(pool)
    assert applied[0] == "0019_partitions.sql"  # and any later migration after it

    assert _dump(old_database) == before
    with psycopg.connect(old_database) as conn:
        kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'run_events'").fetchone()
        assert kind == ("p",)  # partitioned
        days = conn.execute(
            "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'run_events'::regclass AND c.relname <> 'run_events_default'"
        ).fetchone()
        assert days is not None and days[0] >= 10 + 7
        in_default = conn.execute("SELECT count(*) FROM run_events_default").fetchone()
        assert in_default == (0,)
        assert conn.execute("SELECT count(*) FROM trace_spans").fetchone() == (10,)
        assert conn.execute("SELECT count(*) FROM trace_payloads").fetchone() == (10,)
        assert conn.execute("SELECT count(*) FROM trace_payloads_default").fetchone() == (0,)
