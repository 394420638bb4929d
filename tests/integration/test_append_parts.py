"""An append's statement holds only the parts its batch writes, and writes each one it needs.

A batch that stores no snapshot, no manifest and queues nothing runs a statement without
those parts; each part is in the statement of a batch that needs it, and does its work.
"""

from __future__ import annotations

import asyncio
import itertools

import psycopg
import pytest

from graphs.events import EventType
from server.db.pool import Pool, connection_kwargs
from server.events import manifests
from server.events.channels import RUNS_CHANNEL, TICKET
from server.events.log import NewEvent, append_events, load_head
from server.events.store import Parts, _append, creating_statement
from tests.integration.test_eventlog import claim, new_run, stored_snapshot
from tests.integration.test_manifests_stored_once import built

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("snapshot", "manifest", "queued"), list(itertools.product((False, True), repeat=3))
)
def test_an_append_statement_holds_the_parts_of_its_batch_and_no_other(
    snapshot: bool, manifest: bool, queued: bool
) -> None:
    for unread in (False, True):
        statement = _append(Parts(snapshot, manifest, queued), unread=unread)
        assert ("run_snapshots" in statement) is snapshot
        assert (f"INSERT INTO {manifests.TABLE}" in statement) is manifest
        assert ("%(runs_channel)s" in statement) is queued
        assert ("agentrt_appended" in statement) is unread


def test_a_runs_first_events_are_appended_without_a_snapshot_or_a_manifest() -> None:
    statement = creating_statement("INSERT INTO runs (id) VALUES (%(id)s) RETURNING *")
    assert "run_snapshots" not in statement
    assert f"INSERT INTO {manifests.TABLE}" not in statement
    assert "%(runs_channel)s" in statement  # a queued run's ticket, unless held back


async def test_a_held_batch_stores_no_snapshot_and_a_released_one_does(pool: Pool) -> None:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    async with pool.connection() as conn:
        before = await stored_snapshot(conn, run_id)
        head, _ = await append_events(
            conn, run_id, [NewEvent(EventType.GRAPH_CHUNK, {"n": 1})], generation=generation
        )
        # Held by its worker: the statement had no snapshot part, and the row did not move.
        assert await stored_snapshot(conn, run_id) == before
        assert head.snapshot_seq != head.seq
        head, _ = await append_events(
            conn,
            run_id,
            [NewEvent(EventType.RUN_COMPLETED, {})],
            generation=generation,
            head=head,
        )
        stored = await stored_snapshot(conn, run_id)
        assert stored is not None
        assert stored[0] == head.seq
        assert stored[1]["status"] == "completed"


async def test_a_batch_with_a_context_stores_its_manifest(pool: Pool) -> None:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    async with pool.connection() as conn:
        head, stored = await append_events(conn, run_id, [built(1)], generation=generation)
        cur = await conn.execute(
            f"SELECT event_seq FROM {manifests.TABLE} WHERE run_id = %s", (run_id,)
        )
        assert [r["event_seq"] for r in await cur.fetchall()] == [stored[0].seq]
        # A batch without one adds no row.
        await append_events(
            conn,
            run_id,
            [NewEvent(EventType.GRAPH_CHUNK, {"n": 1})],
            generation=generation,
            head=head,
        )
        cur = await conn.execute(
            f"SELECT count(*) AS n FROM {manifests.TABLE} WHERE run_id = %s", (run_id,)
        )
        assert (await cur.fetchone())["n"] == 1


async def test_a_requeued_run_is_announced_to_the_workers(pool: Pool, database_url: str) -> None:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    async with await psycopg.AsyncConnection.connect(
        database_url, **connection_kwargs()
    ) as listener:
        await listener.execute(f"LISTEN {RUNS_CHANNEL}")
        async with pool.connection() as conn:
            # Running: the statement has no ticket part, and no ticket is sent.
            head, _ = await append_events(
                conn, run_id, [NewEvent(EventType.GRAPH_CHUNK, {"n": 1})], generation=generation
            )
            head, _ = await append_events(
                conn,
                run_id,
                [NewEvent(EventType.RUN_REQUEUED, {"reason": "test"})],
                generation=generation,
                head=head,
            )
            assert (await load_head(conn, run_id, lock=False)).status == "queued"
        heard: list[str] = []
        async with asyncio.timeout(30):
            async for note in listener.notifies():
                heard.append(note.payload)
                break
        assert heard == [TICKET + run_id]
