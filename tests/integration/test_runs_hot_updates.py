"""The run row's updates while a run streams touch no index (HOT updates), with many runs.

A guard for the WAL per run (docs/benchmarks.md, "Database cost per run"): an index on a
column that every append changes (`updated_at`, `last_event_seq`, `snapshot`) would make
every one of those updates write an entry in each of the table's indexes, and so would a
page with no room left for the row's new version (the table's fillfactor keeps some).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from graphs.events import EventType
from server.domain import ACTIVE as ACTIVE_STATUSES
from server.domain import RunStatus
from server.events.log import NewEvent, RunHead, append_events
from server.runs.records import claim_next, renew_leases
from server.runs.worker import claim_params
from server.settings import Settings
from tests.support.rows import insert_run

ACTIVE = 6  # runs streaming at once
ROUNDS = 40  # one new run per round, then one delta to every active run


@pytest.fixture(autouse=True)
async def _no_autovacuum(database_url: str, pool: object) -> AsyncIterator[None]:
    # An autovacuum's snapshot (its analyze of a table that just grew by a hundred rows) can
    # keep a page's old row versions from being pruned, and the page then has no room for a
    # new one: the suite once saw 1 of 360 updates leave its page that way.
    async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")
    yield


async def _new_run(conn: AsyncConnection[dict[str, object]]) -> RunHead:
    run_id = await insert_run(conn)
    head, _ = await append_events(
        conn,
        run_id,
        [
            NewEvent(EventType.RUN_CREATED),
            NewEvent(EventType.RUN_STARTED, {"attempt": 1}),
            NewEvent(EventType.MESSAGE_ITEM_CREATED, {"itemId": "i", "role": "assistant"}),
        ],
    )
    return head


async def _updates(conn: AsyncConnection[dict[str, object]]) -> tuple[int, int]:
    # Statistics of this backend reach the shared view once it is idle after this request.
    await conn.execute("SELECT pg_stat_force_next_flush()")
    row = await (
        await conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs'"
        )
    ).fetchone()
    assert row is not None
    return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"])  # type: ignore[call-overload]


async def test_streaming_updates_of_the_run_row_are_hot(database_url: str, pool: object) -> None:
    # `pool` migrates the module's database; one connection keeps the statistics in one backend.
    async with await AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        heads: list[RunHead] = []
        updates = hot = 0
        for n in range(ROUNDS):
            heads = [*heads[-(ACTIVE - 1) :], await _new_run(conn)]
            before = await _updates(conn)
            for i, head in enumerate(heads):
                delta = NewEvent(
                    EventType.MESSAGE_ITEM_DELTA, {"itemId": "i", "delta": f"word {n} " * 10}
                )
                heads[i], _ = await append_events(conn, head.run_id, [delta], head=head)
            after = await _updates(conn)
            updates, hot = updates + after[0] - before[0], hot + after[1] - before[1]
    assert updates == sum(min(n + 1, ACTIVE) for n in range(ROUNDS))
    # Each delta changes no indexed column, and the page keeps room for its new version (the
    # table's fillfactor): with the page full, it would go to another page and every index of
    # `runs` would get an entry.
    assert hot == updates, f"{updates - hot} of {updates} updates were not HOT"


async def test_runs_created_back_to_back_leave_room_for_their_updates(
    database_url: str, pool: object
) -> None:
    # Rows inserted one after another fill their pages up to the table's fillfactor; each
    # run's updates must then find room beside it. Filled to the brim, a page has none until
    # an update has moved a row away, and the index entries that move writes.
    runs, rounds = 120, 3
    async with await AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        run_ids = [await insert_run(conn) for _ in range(runs)]
        heads: dict[str, RunHead | None] = dict.fromkeys(run_ids)
        before = await _updates(conn)
        for n in range(rounds):
            for run_id in run_ids:
                event = (
                    NewEvent(EventType.RUN_CREATED)
                    if n == 0
                    else NewEvent(EventType.MESSAGE_ITEM_DELTA, {"itemId": "i", "delta": "w " * 10})
                )
                heads[run_id], _ = await append_events(conn, run_id, [event], head=heads[run_id])
        after = await _updates(conn)
    updates, hot = after[0] - before[0], after[1] - before[1]
    assert updates == runs * rounds
    assert hot == updates, f"{updates - hot} of {updates} updates were not HOT"


async def test_a_runs_tool_flips_and_lease_renewals_touch_no_index(
    database_url: str, pool: object, settings: Settings
) -> None:
    # Only the claim (it takes the lease, `runs_held`, and enters the active phase) and
    # leaving the phase (the end) may write index entries: running <-> waiting_tool around
    # each tool call and the lease renewals change no column an index of `runs` names.
    runs, tools = 8, 3
    async with await AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        for _ in range(runs):
            run_id = await insert_run(conn)
            await append_events(conn, run_id, [NewEvent(EventType.RUN_CREATED)])
        before = await _updates(conn)
        statuses = []
        for _ in range(runs):
            claim = await claim_next(conn, claim_params(settings, "hot-worker"))  # type: ignore[arg-type]
            assert claim is not None
            head, _ = await append_events(
                conn,
                claim.run.id,
                [NewEvent(EventType.RUN_STARTED, {"attempt": 1})],
                head=claim.head,
            )
            for t in range(tools):
                call = {"toolCallId": f"c{t}", "name": "lookup"}
                head, _ = await append_events(
                    conn,
                    head.run_id,
                    [NewEvent(EventType.TOOL_STARTED, {**call, "args": {}})],
                    head=head,
                )
                statuses.append(head.status)
                head, _ = await append_events(
                    conn,
                    head.run_id,
                    [
                        NewEvent(
                            EventType.TOOL_COMPLETED,
                            {**call, "output": "ok", "outputChars": 2, "truncated": False},
                        )
                    ],
                    head=head,
                )
                statuses.append(head.status)
                assert await renew_leases(conn, "hot-worker", [head.run_id], 30.0)  # type: ignore[arg-type]
            head, _ = await append_events(
                conn, head.run_id, [NewEvent(EventType.RUN_COMPLETED, {})], head=head
            )
            assert head.status == RunStatus.COMPLETED
        after = await _updates(conn)
    assert statuses == [RunStatus.WAITING_TOOL, RunStatus.RUNNING] * tools * runs
    updates, hot = after[0] - before[0], after[1] - before[1]
    # claim + started + 2 per tool + 1 renewal per tool + completed
    assert updates == runs * (3 + 3 * tools)
    # Two per run, and no more: the claim (it takes the lease and enters the active phase)
    # and the end. With an index on the status or the lease's expiry, all 96 were not HOT.
    assert updates - hot == 2 * runs, f"{updates - hot} of {updates} not HOT"


async def test_the_phase_follows_the_status(database_url: str, pool: object) -> None:
    async with await AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        head = await _new_run(conn)
        for status in RunStatus:
            cur = await conn.execute(
                "UPDATE runs SET status = %s WHERE id = %s RETURNING phase",
                (status.value, head.run_id),
            )
            row = await cur.fetchone()
            assert row is not None
            expected = (
                "queued"
                if status == RunStatus.QUEUED
                else "active"
                if status in ACTIVE_STATUSES
                else None
            )
            assert row["phase"] == expected, status


async def _updated_at(conn: AsyncConnection[dict[str, object]], run_id: str) -> object:
    row = await (
        await conn.execute("SELECT updated_at FROM runs WHERE id = %s", (run_id,))
    ).fetchone()
    assert row is not None
    return row["updated_at"]


async def test_updated_at_moves_with_the_status_and_at_most_once_a_minute_between(
    database_url: str, pool: object
) -> None:
    # An append that only moves the head leaves `updated_at` alone (its row version then
    # differs from the last in one column); a change of status moves it, and so does any
    # append once it is a minute old, so that it stays within a minute of the last event.
    async with await AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        head = await _new_run(conn)
        first = await _updated_at(conn, head.run_id)
        for n in range(3):
            delta = NewEvent(EventType.MESSAGE_ITEM_DELTA, {"itemId": "i", "delta": f"w{n}"})
            head, _ = await append_events(conn, head.run_id, [delta], head=head)
        assert await _updated_at(conn, head.run_id) == first
        call = {"toolCallId": "c1", "name": "lookup"}
        head, _ = await append_events(
            conn, head.run_id, [NewEvent(EventType.TOOL_STARTED, {**call, "args": {}})], head=head
        )
        assert head.status == RunStatus.WAITING_TOOL
        moved = await _updated_at(conn, head.run_id)
        assert moved > first  # type: ignore[operator]
        done = {**call, "output": "ok", "outputChars": 2, "truncated": False}
        head, _ = await append_events(
            conn, head.run_id, [NewEvent(EventType.TOOL_COMPLETED, done)], head=head
        )
        assert head.status == RunStatus.RUNNING
        assert await _updated_at(conn, head.run_id) > moved  # type: ignore[operator]
        moved = await _updated_at(conn, head.run_id)
        await conn.execute(
            "UPDATE runs SET updated_at = now() - interval '61 seconds' WHERE id = %s",
            (head.run_id,),
        )
        stale = await _updated_at(conn, head.run_id)
        head, _ = await append_events(
            conn,
            head.run_id,
            [NewEvent(EventType.MESSAGE_ITEM_DELTA, {"itemId": "i", "delta": "late"})],
            head=head,
        )
        assert await _updated_at(conn, head.run_id) > moved > stale  # type: ignore[operator]
        head, _ = await append_events(
            conn, head.run_id, [NewEvent(EventType.RUN_COMPLETED, {})], head=head
        )
        row = await (
            await conn.execute(
                "SELECT updated_at = finished_at AS same FROM runs WHERE id = %s", (head.run_id,)
            )
        ).fetchone()
        assert row is not None and row["same"]
