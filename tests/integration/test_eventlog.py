"""The event log: gapless seq under concurrency, fencing, and a snapshot equal to its fold."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from graphs.events import EventType
from server.auth import Principal
from server.db.pool import Conn, Pool, connection_kwargs, pipelined_transaction
from server.errors import IllegalTransitionError, LeaseLostError, RunFinishedError
from server.events.carry import carried
from server.events.log import (
    LAG_MAX,
    NewEvent,
    append_creating,
    append_events,
    load_head,
    read_events,
)
from server.events.snapshot import apply_event, empty_snapshot
from server.events.store import creating_statement
from server.events.writer import EventWriter
from server.runs.conversations import create_conversation
from server.runs.records import create_run

WHO = Principal("t1", "u1")


async def new_run(pool: Pool) -> str:
    conv = await create_conversation(pool, WHO, None, None, {})
    run = await create_run(pool, WHO, conv["id"], "hello", "demo", {})
    return str(run.id)


async def claim(pool: Pool, run_id: str) -> int:
    """Take the lease the way a worker does and start the run; return the generation."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "UPDATE runs SET lease_generation = lease_generation + 1, lease_owner = 'test',"
            " lease_expires_at = now() + interval '1 minute' WHERE id = %s"
            " RETURNING lease_generation",
            (run_id,),
        )
        row = await cur.fetchone()
        assert row is not None
        generation = int(row["lease_generation"])
        await append_events(
            conn, run_id, [NewEvent("run.started", {"attempt": 1})], generation=generation
        )
    return generation


async def stored_snapshot(conn: Conn, run_id: str) -> tuple[int, dict[str, Any]] | None:
    """The run's stored snapshot as (seq, snapshot), without folding anything after it."""
    cur = await conn.execute(
        "SELECT seq, COALESCE(snapshot, snapshot_text::jsonb) AS snapshot FROM run_snapshots"
        " WHERE run_id = %s",
        (run_id,),
    )
    row = await cur.fetchone()
    return None if row is None else (row["seq"], row["snapshot"])


def fold_of(run_id: str, events: list[tuple[int, str, str]]) -> dict[str, Any]:
    """The snapshot folded from `events` as `read_events` returns them."""
    folded = empty_snapshot(run_id)
    for seq, kind, payload in events:
        apply_event(folded, seq, kind, json.loads(payload)["data"])
    return folded


async def test_concurrent_appends_get_gapless_increasing_seq(pool: Pool) -> None:
    run_id = await new_run(pool)
    await claim(pool, run_id)

    async def append(n: int) -> None:
        async with pool.connection() as conn:
            await append_events(
                conn, run_id, [NewEvent("note", {"n": n, "k": k}) for k in range(3)]
            )

    await asyncio.gather(*(append(n) for n in range(20)))
    async with pool.connection() as conn:
        events = await read_events(conn, run_id, 0, 1000)
        head = await load_head(conn, run_id, lock=False)
    assert [seq for seq, _, _ in events] == list(range(1, 63))
    assert head.seq == 62
    # Each append's three events stay together and in order.
    notes = [json.loads(p)["data"] for _, kind, p in events if kind == "note"]
    for i in range(0, 60, 3):
        assert [n["k"] for n in notes[i : i + 3]] == [0, 1, 2]
        assert len({n["n"] for n in notes[i : i + 3]}) == 1


async def test_superseded_lease_cannot_write(pool: Pool) -> None:
    run_id = await new_run(pool)
    old = await claim(pool, run_id)
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)
    writer = EventWriter(pool, head)
    writer.emit("message.item.created", {"itemId": "i"})
    await writer.flush()
    new = await claim(pool, run_id)  # another worker takes over
    assert new == old + 1
    writer.emit("message.item.delta", {"itemId": "i", "delta": "stale"})
    with pytest.raises(LeaseLostError):
        await writer.flush()
    await writer.close()
    async with pool.connection() as conn:
        with pytest.raises(LeaseLostError):
            await append_events(conn, run_id, [NewEvent("note")], generation=old)
        kinds = [k for _, k, _ in await read_events(conn, run_id, 0, 100)]
    assert "message.item.delta" not in kinds


@pytest.mark.parametrize(
    ("pieces", "items"),
    [(4, 1), (500, 2)],
    ids=["pieces-of-one-item-joined", "a-burst-of-two-items-stored-by-copy"],
)
async def test_stored_snapshot_equals_the_fold_of_the_log(
    pool: Pool, pieces: int, items: int
) -> None:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)
    writer = EventWriter(pool, head)
    ids = ["a", "b"][:items]
    words = [("to ", "be ", "or ", "not")[n] if n < 4 else "la " for n in range(pieces)]
    for item in ids:
        writer.emit("message.item.created", {"itemId": item})
    # Pieces of one item in a row are joined; of two items in turn, each is an event.
    for n, word in enumerate(words):
        writer.emit("message.item.delta", {"itemId": ids[n % items], "delta": word})
    writer.emit("tool.started", {"toolCallId": "c1", "name": "calculator", "args": {}})
    writer.emit("tool.completed", {"toolCallId": "c1", "name": "calculator", "durationMs": 2})
    for k, item in enumerate(ids):
        writer.emit("message.item.completed", {"itemId": item, "text": "".join(words[k::items])})
    await writer.finish("run.completed", {})
    await writer.close()
    async with pool.connection() as conn:
        events = await read_events(conn, run_id, 0, 1000)
        stored = await load_head(conn, run_id, lock=False)
        with pytest.raises(RunFinishedError):
            await append_events(conn, run_id, [NewEvent("note")], generation=generation)
        row = await stored_snapshot(conn, run_id)
    folded = empty_snapshot(run_id)
    for seq, kind, payload in events:
        apply_event(folded, seq, kind, json.loads(payload)["data"])
    assert stored.snapshot == folded
    assert stored.status == "completed"
    # The run's final append stored it: nothing is left for a reader to fold.
    assert row == (len(events), folded)
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    assert len(events) == (1 if items == 1 else pieces) + 5 + 2 * items
    assert [item["text"] for item in folded["items"]] == [
        "".join(words[k::items]) for k in range(items)
    ]


async def test_an_illegal_event_stores_nothing(pool: Pool) -> None:
    run_id = await new_run(pool)
    async with pool.connection() as conn:
        with pytest.raises(IllegalTransitionError):
            await append_events(conn, run_id, [NewEvent("note"), NewEvent("run.completed")])
        head = await load_head(conn, run_id, lock=False)
        assert head.seq == 1 and head.status == "queued"
        assert len(await read_events(conn, run_id, 0, 100)) == 1


async def test_event_data_and_snapshot_text_are_stored_exactly(pool: Pool) -> None:
    """Data with quotes, backslashes, newlines, non-ASCII text and nesting comes back equal."""
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    tricky = {
        "text": 'he said "hi"\\n\tthen\nleft: ünïcödé, 中文, emoji 🙂',
        "nested": {"list": [1, 2.5, None, True, {"k": "v\\"}], "empty": {}},
        "big": 2**53 + 1,
    }
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)
        await append_events(
            conn,
            run_id,
            [
                NewEvent("message.item.created", {"itemId": "a"}),
                NewEvent("message.item.delta", {"itemId": "a", "delta": tricky["text"]}),
                NewEvent("note", tricky),
            ],
            generation=generation,
            head=head,
        )
        events = await read_events(conn, run_id, head.seq, 100)
        stored = await load_head(conn, run_id, lock=False)
    assert [json.loads(payload)["data"] for _, _, payload in events][1:] == [
        {"itemId": "a", "delta": tricky["text"]},
        tricky,
    ]
    assert stored.snapshot["items"][0]["text"] == tricky["text"]


@pytest.mark.parametrize(
    ("data", "read_back"),
    [
        ({"big": 2**70, "n": -(2**64)}, {"big": 2**70, "n": -(2**64)}),
        ({1: "one", None: "none"}, {"1": "one", "null": "none"}),
        ({"score": float("nan"), "top": float("inf")}, {"score": None, "top": None}),
        ({"text\x00": ["a\x00b"]}, {"text\ufffd": ["a\ufffdb"]}),
    ],
    ids=["integers-beyond-64-bits", "keys-that-are-not-strings", "nan-and-infinity", "nul"],
)
async def test_data_orjson_refuses_or_json_cannot_hold_is_stored(
    pool: Pool, data: dict[Any, Any], read_back: dict[str, Any]
) -> None:
    """What `json.dumps` wrote is stored as before; NaN, which Postgres refused, as null.

    And a NUL character, which it refuses too, as U+FFFD.
    """
    run_id = await new_run(pool)
    async with pool.connection() as conn:
        head, _ = await append_events(conn, run_id, [NewEvent("note", data)])
        events = await read_events(conn, run_id, head.seq - 1, 10)
    assert [json.loads(payload)["data"] for _, _, payload in events] == [read_back]


async def test_pooled_connections_write_jsonb_parameters_with_orjson(pool: Pool) -> None:
    """A `Jsonb` holding NaN is stored as null, where `json.dumps`'s `NaN` was refused.

    One holding a NUL character, which `jsonb` refuses, holds U+FFFD in its place.
    """
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT %s::jsonb AS v, %s::jsonb AS w",
            (Jsonb({"x": float("nan"), "ü": [2**63 - 1]}), Jsonb({"k\x00": "a\x00"})),
        )
        row = await cur.fetchone()
    assert row == {"v": {"x": None, "ü": [2**63 - 1]}, "w": {"k\ufffd": "a\ufffd"}}
    async with await psycopg.AsyncConnection.connect(pool.conninfo, autocommit=True) as plain:
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            await plain.execute("SELECT %s::jsonb", (Jsonb({"x": float("nan")}),))
        with pytest.raises(psycopg.errors.UntranslatableCharacter):
            await plain.execute("SELECT %s::jsonb", (Jsonb({"x": "a\x00"}),))


async def test_a_held_runs_snapshot_is_stored_once_no_worker_holds_it(pool: Pool) -> None:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)
        # A new run has no stored snapshot: its claim folded its first event from the log.
        assert await stored_snapshot(conn, run_id) is None
        assert head.snapshot == fold_of(run_id, (await read_events(conn, run_id, 0, 2)))
        writer_head = head
        for word in ("one ", "two "):
            writer_head, _ = await append_events(
                conn,
                run_id,
                [
                    NewEvent("message.item.created", {"itemId": word}),
                    NewEvent("message.item.delta", {"itemId": word, "delta": word}),
                ],
                generation=generation,
                head=writer_head,
            )
        events = await read_events(conn, run_id, 0, 100)
        # The worker holds the run: its appends stored no snapshot, and a reader folds the
        # log.
        assert await stored_snapshot(conn, run_id) is None
        assert writer_head.snapshot_seq == 0
        fresh = await load_head(conn, run_id, lock=False)
        assert (fresh.seq, fresh.snapshot) == (6, fold_of(run_id, events))
        assert fresh.snapshot == writer_head.snapshot
        # Requeued (as the lease reaper does, with no generation): no worker holds it.
        await append_events(conn, run_id, [NewEvent("run.requeued", {"reason": "test"})])
        events = await read_events(conn, run_id, 0, 100)
        assert await stored_snapshot(conn, run_id) == (7, fold_of(run_id, events))
        assert fold_of(run_id, events)["status"] == "queued"


async def test_a_held_runs_stored_snapshot_lags_at_most_lag_max_events(pool: Pool) -> None:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    stored_at = set()
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)
        for n in range(3 * LAG_MAX // 10):
            head, _ = await append_events(
                conn,
                run_id,
                [NewEvent("note", {"n": n, "k": k}) for k in range(10)],
                generation=generation,
                head=head,
            )
            # None stored at the run's creation: the first comes once LAG_MAX events lag.
            seq = (await stored_snapshot(conn, run_id) or (0, None))[0]
            assert head.seq - seq <= LAG_MAX
            assert seq == head.snapshot_seq
            stored_at.add(seq)
        events = await read_events(conn, run_id, 0, 10_000)
        row = await stored_snapshot(conn, run_id)
        assert row is not None
        assert row[1] == fold_of(run_id, [e for e in events if e[0] <= row[0]])
    assert len(stored_at) >= 3  # none at first, then at least twice while held


async def test_a_new_run_is_one_row_version_written_with_its_first_event(
    pool: Pool, database_url: str
) -> None:
    """The run's insert takes the place of the head's update: no second version of the row."""
    conv = await create_conversation(pool, WHO, None, None, {})
    run_id = "run_created_in_one_statement"
    statement = creating_statement(
        "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id,"
        " status, last_event_seq) VALUES (%(id)s, %(conv)s, %(tenant)s, %(user)s, 'demo',"
        " 'msg_of_' || %(id)s, %(status)s, %(seq)s) RETURNING *"
    )
    created = NewEvent(EventType.RUN_CREATED, {"conversationId": conv["id"], "model": "demo"})
    values = {"conv": conv["id"], "tenant": WHO.tenant_id, "user": WHO.user_id}
    # A connection of its own: a backend's statistics of earlier transactions may still be
    # pending, and `pg_stat_xact_user_tables` counts them too.
    async with await psycopg.AsyncConnection.connect(database_url, **connection_kwargs()) as conn:
        async with pipelined_transaction(conn):
            await conn.execute(
                "INSERT INTO messages (id, conversation_id, tenant_id, user_id, run_id, role,"
                " content) VALUES ('msg_of_' || %s, %s, %s, %s, %s, 'user', 'hi')",
                (run_id, conv["id"], WHO.tenant_id, WHO.user_id, run_id),
            )
            head, cursor = await append_creating(conn, run_id, [created], statement, values)
            cur = await conn.execute(
                "SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'runs'"
            )
            assert await cur.fetchone() == {"n_tup_ins": 1, "n_tup_upd": 0}
        row = await cursor.fetchone()
        assert row is not None
        assert (row["last_event_seq"], row["status"]) == (1, "queued")
        assert (head.seq, head.snapshot_seq, head.status) == (1, 0, "queued")
        # What a stream may start with is what a replay reads, byte for byte.
        batch = carried(row["carried"])
        assert batch is not None
        assert batch.events == await read_events(conn, run_id, 0, 10)
        # No snapshot stored for a new run: a reader folds its first event from the log.
        assert await stored_snapshot(conn, run_id) is None
        assert (await load_head(conn, run_id, lock=False)).snapshot == head.snapshot
