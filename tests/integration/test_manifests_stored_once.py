"""A model call's manifest is stored once, in `context_manifests`; the log keeps a stub.

Every path an append takes (one statement, a pipelined transaction with store hooks, COPY)
stores the manifest's row and the event's stub together; live frames and every read of the
log give the event back as it was appended, byte for byte.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from graphs.events import EventType
from server import jsontext
from server.agents.context_store import run_manifests
from server.db.pool import Pool
from server.errors import LeaseLostError
from server.events.log import (
    NewEvent,
    RunHead,
    StoredEvent,
    StoreHook,
    append_events,
    load_head,
    read_events,
)
from server.events.manifests import stored
from server.events.notify import Notifier
from server.usage.ledger import MODEL_CALLS
from tests.integration.test_carried_notifications import (
    Tail,
    following,
    notifier,
    replay,
    started,
)
from tests.integration.test_store_hooks import usage_event

pytestmark = pytest.mark.timeout(120)
__all__ = ["notifier"]  # the fixture, used by name


def manifest(step: int, attempt: int = 1, note: str = "") -> dict[str, Any]:
    """A manifest as the context engine emits one (its size and nesting, not its meaning)."""
    return {
        "step": step,
        "attempt": attempt,
        "model": "scripted:x",
        "profile": {"name": "default", "version": 3},
        "window": 32768,
        "totalTokens": 60 + step,
        "tools": ["calculator", "current_time"],
        "sections": [
            {"kind": "system", "name": "instructions", "items": 1, "tokens": 31, "note": note},
            {"kind": "history", "name": "history", "items": step, "budget": 28000, "tokens": 9},
            {"kind": "current", "name": "current", "items": 1, "budget": None, "tokens": 5},
        ],
        "text": 'héllo 日本語 \u2028 "quoted"',
    }


# The keys a row's columns give back, which its text leaves out.
COLUMN_KEYS = {"step", "attempt", "model", "profile", "window", "totalTokens"}


def built(step: int, attempt: int = 1, note: str = "") -> NewEvent:
    return NewEvent(EventType.CONTEXT_BUILT, manifest(step, attempt, note))


async def stored_rows(
    pool: Pool, run_id: str, kind: str = EventType.CONTEXT_BUILT
) -> dict[int, dict[str, Any]]:
    """The data of the run's events of type `kind` in the log, by seq, as stored."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT seq, data FROM run_events WHERE run_id = %s AND type = %s", (run_id, kind)
        )
        return {r["seq"]: dict(r["data"]) for r in await cur.fetchall()}


async def table_rows(pool: Pool, run_id: str) -> dict[int, dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT event_seq, step, attempt, tenant_id, agent_version, total_tokens,"
            f" {stored()} AS manifest, manifest IS NULL AS as_text, manifest_text::text AS text"
            " FROM context_manifests WHERE run_id = %s",
            (run_id,),
        )
        return {r["event_seq"]: r for r in await cur.fetchall()}


async def append_in_turn(
    pool: Pool,
    tail: Tail,
    head: RunHead,
    generation: int,
    batches: list[list[NewEvent]],
    keep: Callable[[StoredEvent], bool],
    hooks: Callable[[int], list[StoreHook]] = lambda _: [MODEL_CALLS],
    extra: Callable[[int], Any] = lambda _: None,
) -> tuple[RunHead, dict[int, Any]]:
    """Append `batches` one after another, each read by `tail` before the next.

    `hooks` and `extra` give each batch's, by its number. Return the head after the last and
    the data appended of the events `keep` picks, by seq.
    """
    appended: dict[int, Any] = {}
    for number, batch in enumerate(batches):
        async with pool.connection() as conn:
            head, stored_events = await append_events(
                conn,
                head.run_id,
                batch,
                generation=generation,
                head=head,
                hooks=hooks(number),
                extra=extra(number),
            )
        appended |= {e.seq: dict(e.data) for e in stored_events if keep(e)}
        await tail.until(head.seq)
    await asyncio.wait_for(tail.task, 60)
    return head, appended


def calls_after_first(number: int) -> list[StoreHook]:
    """`append_in_turn`'s hooks: none for the first batch (one statement), then the ledger's."""
    return [MODEL_CALLS] if number else []


def is_built(event: StoredEvent) -> bool:
    return event.type == EventType.CONTEXT_BUILT


async def assert_reads_give_back(
    pool: Pool, notifier: Notifier, tail: Tail, head: RunHead, start: int, appended: dict[int, Any]
) -> None:
    """A live stream equals a replay byte for byte; reads give back `appended` (data by seq)."""
    run_id = head.run_id
    assert tail.text == await replay(pool, notifier, run_id, start)
    async with pool.connection() as conn:
        read = await read_events(conn, run_id, start, 1000)
        # A head folded from the log (stubs included) is the head the appender kept.
        await conn.execute("DELETE FROM run_snapshots WHERE run_id = %s", (run_id,))
        folded = await load_head(conn, run_id, lock=False)
    by_seq = {seq: json.loads(wire) for seq, _, wire in read}
    for seq, data in appended.items():
        assert by_seq[seq]["data"] == data
    assert folded.snapshot == head.snapshot


async def test_every_append_path_stores_the_manifest_once_and_reads_give_it_back(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    tail, _ = await following(pool, notifier, run_id, start)
    batches = [
        [built(1)],  # one statement
        [built(2), usage_event("mc_1")],  # a hooked batch: the pipelined transaction
        [built(3), *[NewEvent("note", {"n": n}) for n in range(80)]],  # COPY
        [NewEvent(EventType.RUN_COMPLETED, {})],
    ]
    appended: dict[int, dict[str, Any]] = {}
    for batch in batches:
        async with pool.connection() as conn:
            head, stored = await append_events(
                conn, run_id, batch, generation=generation, head=head, hooks=[MODEL_CALLS]
            )
        appended |= {e.seq: dict(e.data) for e in stored if e.type == EventType.CONTEXT_BUILT}
        await tail.until(head.seq)
    await asyncio.wait_for(tail.task, 60)

    # The log holds a stub; the table holds the manifest, one row per event.
    rows = await stored_rows(pool, run_id)
    assert sorted(rows) == sorted(appended) and len(rows) == 3
    for seq, data in rows.items():
        assert data == {
            "step": appended[seq]["step"],
            "attempt": 1,
            "storedIn": "context_manifests",
        }
    table = await table_rows(pool, run_id)
    assert sorted(table) == sorted(appended)
    for seq, row in table.items():
        assert row["manifest"] == appended[seq]
        # Kept as compact text, not as `jsonb`, without the keys the row's columns hold.
        rest = {k: v for k, v in appended[seq].items() if k not in COLUMN_KEYS}
        assert row["as_text"] and row["text"] == jsontext.dumps(rest)
        assert (row["step"], row["attempt"], row["tenant_id"]) == (appended[seq]["step"], 1, "t1")
        assert (row["agent_version"], row["total_tokens"]) == (3, appended[seq]["totalTokens"])

    # A live stream, a replay and a read of the log give the manifest as appended.
    await assert_reads_give_back(pool, notifier, tail, head, start, appended)


async def test_a_step_built_twice_keeps_each_manifest_and_readers_take_the_latest(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    for note in ("first", "again"):
        async with pool.connection() as conn:
            head, _ = await append_events(
                conn, run_id, [built(1, note=note)], generation=generation, head=head
            )
    async with pool.connection() as conn:
        read = [
            json.loads(wire)["data"] for _, _, wire in await read_events(conn, run_id, start, 9)
        ]
        latest = await run_manifests(conn, run_id, step=1, attempt=1)
    assert [d["sections"][0]["note"] for d in read] == ["first", "again"]
    assert len(await table_rows(pool, run_id)) == 2
    assert [m["sections"][0]["note"] for m in latest] == ["again"]
    assert latest[0]["eventId"] == head.seq


async def test_an_event_stored_whole_is_read_as_stored_and_one_without_a_step_has_no_row(
    pool: Pool,
) -> None:
    run_id, generation, head = await started(pool)
    whole = manifest(1, note="in the log")
    async with pool.connection() as conn:
        # As the log held it before manifests were kept once: the whole data in the event, and
        # the table's row of the same step rewritten by a later build of that step.
        await conn.execute(
            "INSERT INTO run_events (run_id, seq, type, ts, attempt, data)"
            " VALUES (%s, %s, 'context.built', now(), 1, %s::jsonb)",
            (run_id, head.seq + 1, json.dumps(whole)),
        )
        await conn.execute(
            "INSERT INTO context_manifests (run_id, step, attempt, event_seq, tenant_id,"
            " manifest) VALUES (%s, 1, 1, %s, 't1', %s::jsonb)",
            (run_id, head.seq + 1, json.dumps(manifest(1, note="rewritten"))),
        )
        await conn.execute(
            "UPDATE runs SET last_event_seq = last_event_seq + 1 WHERE id = %s", (run_id,)
        )
        head = await load_head(conn, run_id, lock=False)
        no_step = NewEvent(EventType.CONTEXT_BUILT, {"note": "no step"})
        head, _ = await append_events(conn, run_id, [no_step], generation=generation, head=head)
        read = await read_events(conn, run_id, head.seq - 2, 9)
    assert [json.loads(wire)["data"] for _, _, wire in read] == [whole, {"note": "no step"}]
    assert sorted(await table_rows(pool, run_id)) == [head.seq - 1]
    # A row kept as `jsonb` (before manifests were kept as text) is read as the text ones are.
    async with pool.connection() as conn:
        kept = await run_manifests(conn, run_id, step=1)
        assert [m["sections"][0]["note"] for m in kept] == ["rewritten"]
        # A row holds its manifest in one form.
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute(
                "INSERT INTO context_manifests (run_id, step, attempt, event_seq, tenant_id)"
                " VALUES (%s, 9, 1, 999, 't1')",
                (run_id,),
            )


# Manifests whose six keys the row's columns cannot all give back exactly: kept whole.
# (Values the columns refuse, such as a fractional window, fail the append as before.)
ODD = [
    {"model": None},
    {"model": 7},
    {"profile": {"name": "default", "version": 3, "hash": "x"}},
    {"profile": {"name": 5, "version": 3}},
    {"profile": {"name": "default"}},
    {"profile": None},
    {"window": None},
    {"totalTokens": None},
    {"attempt": None},
]


async def test_a_manifest_the_columns_cannot_give_back_is_kept_whole(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    tail, _ = await following(pool, notifier, run_id, start)
    cases = [{**manifest(n + 1), **odd} for n, odd in enumerate(ODD)]
    cases.append({k: v for k, v in manifest(len(ODD) + 1).items() if k != "model"})
    cases.append({k: v for k, v in manifest(len(ODD) + 2).items() if k != "attempt"})
    cases.append({k: v for k, v in manifest(len(ODD) + 3).items() if k != "window"})
    batch = [
        *(NewEvent(EventType.CONTEXT_BUILT, case) for case in cases),
        NewEvent(EventType.RUN_COMPLETED, {}),
    ]
    head, appended = await append_in_turn(
        pool, tail, head, generation, [batch], is_built, hooks=lambda _: []
    )
    table = await table_rows(pool, run_id)
    assert sorted(table) == sorted(appended)
    for seq, row in table.items():
        assert row["text"] == jsontext.dumps(appended[seq]), appended[seq]
        assert row["manifest"] == appended[seq]
    await assert_reads_give_back(pool, notifier, tail, head, start, appended)
    async with pool.connection() as conn:
        by_step = {m["step"]: m for m in await run_manifests(conn, run_id)}
    # The context route gives the manifest as appended: no key put back that it lacked.
    assert by_step[1]["model"] is None and "model" not in by_step[len(ODD) + 1]


# Values the row's integer columns cannot take: such a manifest stays whole in the log.
UNFIT = [
    {"totalTokens": 60.5},  # a custom builder's estimate
    {"window": 2**31},
    {"attempt": "1"},
    {"attempt": 1.0},
    {"profile": {"name": "default", "version": 1.5}},
    {"profile": {"name": "default", "version": True}},
    {"step": 2**40},
]


async def test_a_manifest_its_columns_cannot_take_stays_whole_and_its_append_succeeds(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    tail, _ = await following(pool, notifier, run_id, start)
    cases = [{**manifest(n + 1), **unfit} for n, unfit in enumerate(UNFIT)]
    batch = [
        *(NewEvent(EventType.CONTEXT_BUILT, case) for case in cases),
        built(len(UNFIT) + 1),  # beside them, one the table keeps
        NewEvent(EventType.RUN_COMPLETED, {}),
    ]
    head, appended = await append_in_turn(
        pool, tail, head, generation, [batch], is_built, hooks=lambda _: []
    )
    rows = await stored_rows(pool, run_id)
    kept = max(appended)
    assert {seq: rows[seq] for seq in appended if seq != kept} == {
        seq: data for seq, data in appended.items() if seq != kept
    }
    assert rows[kept]["storedIn"] == "context_manifests"
    assert sorted(await table_rows(pool, run_id)) == [kept]
    await assert_reads_give_back(pool, notifier, tail, head, start, appended)


async def test_an_append_to_a_deleted_run_leaves_no_row_beside_the_log(pool: Pool) -> None:
    """With no foreign key to `runs` (docs/decisions/2047), the append's own update guards."""
    run_id, generation, head = await started(pool)
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM runs WHERE id = %s", (run_id,))
    for batch in (
        [built(1)],  # one statement
        [built(2), usage_event("mc_gone")],  # the pipelined transaction with store hooks
        [built(3), *[NewEvent("note", {"n": n}) for n in range(80)]],  # COPY
        [NewEvent(EventType.RUN_COMPLETED, {})],  # the snapshot's store
    ):
        async with pool.connection() as conn:
            # The run's row did not move: to the appender, a lost lease.
            with pytest.raises(LeaseLostError):
                await append_events(
                    conn, run_id, batch, generation=generation, head=head, hooks=[MODEL_CALLS]
                )
    async with pool.connection() as conn:
        for table in ("run_events", "context_manifests", "model_calls", "run_snapshots"):
            cur = await conn.execute(
                f"SELECT count(*) AS n FROM {table} WHERE run_id = %s", (run_id,)
            )
            assert await cur.fetchone() == {"n": 0}, table
