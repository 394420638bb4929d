"""Migration 0037 moves each run's snapshot out of its row, and runs go on from there."""

from __future__ import annotations

import json
from importlib import resources

from psycopg.types.json import Jsonb

from graphs.events import EventType
from server.db.pool import migrate, open_pool
from server.events.log import NewEvent, append_events, load_head
from server.events.snapshot import apply_event, empty_snapshot
from server.settings import Settings
from tests.support.rows import insert_run

SNAPSHOTS = 37  # the migration under test


def _before(version: int) -> list[tuple[int, str, str]]:
    """The migrations older than `version`, in order, as (version, name, SQL)."""
    folder = resources.files("server.db") / "migrations"
    found = []
    for entry in folder.iterdir():
        number = int(entry.name.split("_", 1)[0]) if entry.name.endswith(".sql") else None
        if number is not None and number < version:
            found.append((number, entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


async def test_each_runs_snapshot_moves_out_of_its_row(
    database_url: str, settings: Settings
) -> None:
    created = [
        (1, EventType.RUN_CREATED, {"model": "m"}),
        (2, EventType.RUN_STARTED, {"attempt": 1}),
        (3, EventType.MESSAGE_ITEM_CREATED, {"itemId": "i", "role": "assistant"}),
        (4, EventType.MESSAGE_ITEM_DELTA, {"itemId": "i", "delta": "half an answer"}),
    ]
    async with open_pool(database_url, settings) as pool:
        async with pool.connection() as conn:
            # The schema as it was before, with a run mid-answer as that code stored it: its
            # snapshot in its row, in step with its log; and a run with no event yet.
            await conn.execute(
                "CREATE TABLE schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, sql in _before(SNAPSHOTS):
                async with conn.transaction():
                    await conn.execute(sql.encode(), prepare=False)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (version, name),
                    )
            busy, blank = await insert_run(conn), await insert_run(conn)
            snapshot = empty_snapshot(busy)
            for seq, kind, data in created:
                apply_event(snapshot, seq, kind, data)
                await conn.execute(
                    "INSERT INTO run_events (run_id, seq, type, ts, attempt, data)"
                    " VALUES (%s, %s, %s, now(), 1, %s)",
                    (busy, seq, str(kind), Jsonb(data)),
                )
            await conn.execute(
                "UPDATE runs SET last_event_seq = 4, status = 'running', snapshot = %s"
                " WHERE id = %s",
                (json.dumps(snapshot), busy),
            )

        assert await migrate(pool) == [
            name for version, name, _ in _before(10_000) if version >= SNAPSHOTS
        ]

        async with pool.connection() as conn:
            cur = await conn.execute("SELECT run_id, seq, snapshot FROM run_snapshots")
            assert [tuple(r.values()) for r in await cur.fetchall()] == [(busy, 4, snapshot)]
            cur = await conn.execute(
                "SELECT count(*) AS n FROM information_schema.columns"
                " WHERE table_name = 'runs' AND column_name = 'snapshot'"
            )
            assert (await cur.fetchone() or {})["n"] == 0
            head = await load_head(conn, busy, lock=False)
            assert (head.seq, head.snapshot_seq, head.snapshot) == (4, 4, snapshot)
            # Both runs go on: the busy one ends, the blank one gets its first event.
            head, _ = await append_events(
                conn, busy, [NewEvent(EventType.RUN_COMPLETED, {})], head=head
            )
            first = await load_head(conn, blank, lock=False)
            assert (first.seq, first.snapshot) == (0, empty_snapshot(blank))
            await append_events(conn, blank, [NewEvent(EventType.RUN_CREATED, {})])
            cur = await conn.execute(
                "SELECT run_id, seq, snapshot IS NULL AS as_text, snapshot_text::jsonb AS text"
                " FROM run_snapshots ORDER BY seq"
            )
            found = await cur.fetchall()
            rows = [(r["run_id"], r["seq"]) for r in found]
            # Stored again, the `jsonb` row went to the text form (docs/decisions/2049).
            assert all(r["as_text"] for r in found)
            assert found[1]["text"] == (await load_head(conn, busy, lock=False)).snapshot
    assert rows == [(blank, 1), (busy, 5)]
    assert head.snapshot["status"] == "completed"
    assert head.snapshot["items"][0]["text"] == "half an answer"
