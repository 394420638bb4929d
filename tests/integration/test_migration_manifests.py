"""Migration 0043: manifests stored before it read as they were; runs go on storing stubs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from graphs.events import EventType
from server.agents.context_store import run_manifests
from server.db.pool import migrate, open_pool
from server.events.log import NewEvent, append_events, load_head, read_events
from server.settings import Settings
from tests.integration.test_manifests_stored_once import manifest
from tests.support.postgres import create_database, drop_database, migrate_before

pytestmark = pytest.mark.timeout(180)
ONCE = 43  # the migration under test
FIRST = manifest(1, note="first build")
AGAIN = manifest(1, note="built again")


@pytest.fixture
def old_database(pg_admin_url: str) -> Iterator[tuple[str, str]]:
    """A database before the migration, with a run whose step 1 was built twice."""
    url = create_database(pg_admin_url)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate_before(conn, ONCE)
        conn.execute("INSERT INTO conversations (id, tenant_id, user_id) VALUES ('c', 't', 'u')")
        conn.execute(
            "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id,"
            " status, last_event_seq) VALUES ('r', 'c', 't', 'u', 'm', 'msg', 'running', 3)"
        )
        # The trigger of the time copied each event's data into the table, upserting by step.
        for seq, kind, data in [
            (1, EventType.RUN_CREATED, {"model": "m"}),
            (2, EventType.CONTEXT_BUILT, FIRST),
            (3, EventType.CONTEXT_BUILT, AGAIN),
        ]:
            conn.execute(
                "INSERT INTO run_events (run_id, seq, type, ts, attempt, data)"
                " VALUES ('r', %s, %s, now(), 1, %s::jsonb)",
                (seq, str(kind), json.dumps(data)),
            )
    yield url, "r"
    drop_database(pg_admin_url, url)


async def test_events_stored_whole_read_as_stored_and_new_builds_are_kept_once(
    old_database: tuple[str, str], settings: Settings
) -> None:
    url, run_id = old_database
    async with open_pool(url, settings) as pool:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT event_seq FROM context_manifests")
            assert [r["event_seq"] for r in await cur.fetchall()] == [3]  # upserted
        assert "0043_manifests_stored_once.sql" in await migrate(pool)

        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM pg_trigger WHERE tgname = 'run_events_context_manifest'"
            )
            assert (await cur.fetchone() or {})["n"] == 0
            read = [json.loads(w)["data"] for _, _, w in await read_events(conn, run_id, 1, 9)]
            assert read == [FIRST, AGAIN]
            assert [m["sections"][0]["note"] for m in await run_manifests(conn, run_id)] == [
                "built again"
            ]

            head = await load_head(conn, run_id, lock=False)
            later = manifest(2, note="after the migration")
            head, _ = await append_events(
                conn, run_id, [NewEvent(EventType.CONTEXT_BUILT, later)], head=head
            )
            cur = await conn.execute(
                "SELECT data FROM run_events WHERE run_id = %s AND seq = %s", (run_id, head.seq)
            )
            assert (await cur.fetchone() or {})["data"] == {
                "step": 2,
                "attempt": 1,
                "storedIn": "context_manifests",
            }
            read = [json.loads(w)["data"] for _, _, w in await read_events(conn, run_id, 1, 9)]
            assert read == [FIRST, AGAIN, later]
            steps = [(m["step"], m["eventId"]) for m in await run_manifests(conn, run_id)]
            assert steps == [(1, 3), (2, head.seq)]
