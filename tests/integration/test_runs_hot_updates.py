"""The run row's updates while a run streams touch no index (HOT updates), with many runs.

A guard for the WAL per run (docs/benchmarks.md, "Database cost per run"): an index on a
column that every append changes (`updated_at`, `last_event_seq`, `snapshot`) would make
every one of those updates write an entry in each of the table's indexes.
"""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from graphs.events import EventType
from server.events.log import NewEvent, RunHead, append_events
from server.ids import new_id

ACTIVE = 6  # runs streaming at once
ROUNDS = 40  # one new run per round, then one delta to every active run


async def _new_run(conn: AsyncConnection[dict[str, object]]) -> RunHead:
    run_id, conv = new_id("run"), new_id("conv")
    await conn.execute(
        "INSERT INTO conversations (id, tenant_id, user_id) VALUES (%s, 't', 'u')", (conv,)
    )
    await conn.execute(
        "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id)"
        " VALUES (%s, %s, 't', 'u', 'm', 'msg')",
        (run_id, conv),
    )
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
    # Each delta changes no indexed column; with no room on the row's page the new version
    # goes to another page and every index of `runs` gets an entry.
    assert hot / updates >= 0.9, f"{hot} of {updates} updates were HOT"
