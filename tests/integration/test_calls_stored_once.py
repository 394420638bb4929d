"""A model call's record is stored once, in its ledger row; the log keeps a stub.

Every path an append takes stores the row and the event's stub together; live frames and
every read of the log give the event back with its call, equal to what was appended, and a
live stream and a replay stay byte-identical. Only calls the row gives back exactly are
kept so; any other is stored whole.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from graphs.events import EventType
from server.db.pool import Pool
from server.events import calls
from server.events.log import NewEvent, StoredEvent, append_creating, append_events, read_events
from server.events.notify import Notifier
from server.usage.ledger import MODEL_CALLS
from tests.integration.test_carried_notifications import following, notifier, started
from tests.integration.test_manifests_stored_once import (
    append_in_turn,
    assert_reads_give_back,
    calls_after_first,
    stored_rows,
)
from tests.integration.test_store_hooks import usage_event

pytestmark = pytest.mark.timeout(120)
__all__ = ["notifier"]  # the fixture, used by name


def failed_call(call_id: str) -> NewEvent:
    """A failed attempt: no item, no tokens, no cost, an error's text and status."""
    event = usage_event(call_id)
    event.data["call"].update(
        status="failed",
        latencyMs=1200.0,
        ttftMs=None,
        itemId=None,
        finishReason=None,
        inputTokens=None,
        outputTokens=None,
        cachedInputTokens=None,
        reasoningTokens=None,
        totalTokens=None,
        cost=None,
        priceSource=None,
        errorClass="rate_limited",
        statusCode=429,
        error='slow down: "quota" héllo 日本語',
    )
    event.data["purpose"] = "memory"
    return event


def priced(call_id: str, cost: str, latency: float) -> NewEvent:
    event = usage_event(call_id)
    event.data["call"].update(cost=cost, latencyMs=latency, ttftMs=latency / 2)
    return event


async def ledger(pool: Pool, run_id: str) -> dict[str, dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM model_calls WHERE run_id = %s", (run_id,))
        return {r["id"]: r for r in await cur.fetchall()}


async def test_every_append_path_stores_the_call_once_and_reads_give_it_back(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    tail, _ = await following(pool, notifier, run_id, start)
    batches = [
        [priced("mc_1", "0.00012", 1.0)],  # one statement (no hook)
        [failed_call("mc_2"), priced("mc_3", "12.5", 0.181)],  # hooked: pipelined
        [priced("mc_4", "0", 3.25), *[NewEvent("note", {"n": n}) for n in range(80)]],  # COPY
        [NewEvent(EventType.RUN_COMPLETED, {})],
    ]
    head, appended = await append_in_turn(
        pool,
        tail,
        head,
        generation,
        batches,
        lambda e: e.type == EventType.USAGE,
        hooks=calls_after_first,
    )

    # The log holds a stub: the event's other keys, the marker and the call's id.
    rows = await stored_rows(pool, run_id, EventType.USAGE)
    assert sorted(rows) == sorted(appended) and len(rows) == 4
    for seq, data in rows.items():
        rest = {k: v for k, v in appended[seq].items() if k != "call"}
        assert data == {
            **rest,
            "storedIn": "model_calls",
            "callId": appended[seq]["call"]["callId"],
        }
    # The ledger holds each call, with the fields it lacked before.
    table = await ledger(pool, run_id)
    assert sorted(table) == ["mc_1", "mc_2", "mc_3", "mc_4"]
    assert table["mc_2"]["error"] == 'slow down: "quota" héllo 日本語'
    assert (table["mc_2"]["status_code"], table["mc_2"]["item_id"]) == (429, None)
    assert table["mc_3"]["item_id"] == "item" and table["mc_3"]["cost"] == Decimal("12.5")

    # A live stream and a replay are the same bytes; both, and a read of the log, give back
    # every event as appended (numbers as numbers: 1.0 may come back as 1).
    await assert_reads_give_back(pool, notifier, tail, head, start, appended)


async def test_a_call_the_row_cannot_give_back_is_stored_whole_and_a_stub_without_its_row(
    pool: Pool,
) -> None:
    run_id, generation, head = await started(pool)
    places = priced("mc_places", "0.00000000001", 1.0)  # eleven places: the column has ten
    extra = usage_event("mc_extra")
    extra.data["call"]["retries"] = 1
    async with pool.connection() as conn:
        head, _ = await append_events(
            conn, run_id, [places, extra], generation=generation, head=head, hooks=[MODEL_CALLS]
        )
    rows = await stored_rows(pool, run_id, EventType.USAGE)
    assert [d["call"]["callId"] for d in rows.values()] == ["mc_places", "mc_extra"]
    assert sorted(await ledger(pool, run_id)) == ["mc_extra", "mc_places"]  # by the hook

    # A stub whose row is gone (an operator's delete) reads as the stub, never as another call.
    kept = usage_event("mc_kept")
    async with pool.connection() as conn:
        head, _ = await append_events(conn, run_id, [kept], generation=generation, head=head)
        await conn.execute("DELETE FROM model_calls WHERE id = 'mc_kept'")
        read = await read_events(conn, run_id, head.seq - 1, 9)
    assert json.loads(read[0][2])["data"] == {
        "totals": kept.data["totals"],
        "storedIn": "model_calls",
        "callId": "mc_kept",
    }


def random_call(rng: random.Random, n: int) -> dict[str, Any]:
    """A call as the model caller writes one, its values drawn over their whole range."""

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.25 else value

    # Below 10^10, with up to ten places: what numeric(20, 10) holds.
    cost = Decimal(rng.randrange(0, 10**14)).scaleb(-rng.randrange(4, 11))
    latency = rng.choice([0.0, 1.0, round(rng.uniform(0, 1e6), 3), rng.randrange(0, 10**9)])
    return {
        "callId": f"mc_random_{n}",
        "step": rng.randrange(0, 1000),
        "attempt": rng.randrange(1, 9),
        "modelId": "openai:gpt-x",
        "provider": "openai",
        "model": rng.choice(["gpt-x", "名前", 'with "quotes" \\ \u2028']),
        "requestedModel": "openai:gpt-x",
        "fallbackIndex": rng.randrange(0, 3),
        "status": rng.choice(["ok", "failed"]),
        "latencyMs": latency,
        "ttftMs": maybe(round(rng.uniform(0, 5000), 3)),
        "itemId": maybe("lc_run--x"),
        "finishReason": maybe("stop"),
        "inputTokens": maybe(rng.randrange(0, 2**31)),
        "outputTokens": maybe(rng.randrange(0, 10**6)),
        "cachedInputTokens": maybe(0),
        "reasoningTokens": maybe(rng.randrange(0, 100)),
        "totalTokens": maybe(rng.randrange(0, 10**7)),
        "cost": maybe(format(cost.normalize(), "f")),
        "priceSource": maybe("litellm"),
        "errorClass": maybe("timeout"),
        "statusCode": maybe(rng.choice([400, 429, 500])),
        "error": maybe("x" * rng.randrange(0, 500)),
    }


async def test_the_row_gives_back_every_kept_call_exactly(pool: Pool) -> None:
    """500 random calls: what live frames carry is the text a read builds from the row."""
    run_id, _, _ = await started(pool)
    rng = random.Random(20261205)
    drawn = [random_call(rng, n) for n in range(500)]
    assert all(calls.kept(c) for c in drawn)
    now = datetime.now(UTC)
    events = [
        StoredEvent(run_id, n, EventType.USAGE, now, {"call": c, "totals": {}})
        for n, c in enumerate(drawn)
    ]
    wholes = []
    for ev in events:
        kept = calls.stub(ev.type, ev.data)
        assert kept is not None
        wholes.append(kept[1])
    async with pool.connection() as conn:
        async with conn.transaction(), conn.cursor() as cur:
            await calls.HOOK.store(cur, run_id, events)
        cur = await conn.execute(
            "SELECT (w.whole::jsonb -> 'call')::text AS carried,"
            " agentrt_model_call(m)::text AS built"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS w(whole, n)"
            " JOIN model_calls m ON m.id = 'mc_random_' || (w.n - 1) ORDER BY w.n",
            (wholes,),
        )
        rows = await cur.fetchall()
    assert len(rows) == 500
    assert [r["carried"] for r in rows] == [r["built"] for r in rows]
    # The same values as the caller wrote (numbers as numbers).
    assert [json.loads(r["built"]) for r in rows] == drawn


def test_only_calls_the_row_gives_back_exactly_are_kept() -> None:
    call = dict(usage_event("mc").data["call"])
    assert calls.kept(call)
    refused = [
        {**call, "cost": "0.10"},  # not as `money` writes it
        {**call, "cost": "1E-7"},
        {**call, "cost": "0.00000000001"},  # eleven places
        {**call, "cost": "10000000000"},  # beyond numeric(20, 10)
        {**call, "cost": 0.5},
        {**call, "latencyMs": float("nan")},
        {**call, "latencyMs": None},
        {**call, "latencyMs": True},
        {**call, "ttftMs": "1"},
        {**call, "step": 1.0},
        {**call, "inputTokens": 2**31},
        {**call, "statusCode": False},
        {**call, "status": "unknown"},
        {**call, "provider": None},
        {**call, "error": 5},
        {**call, "extra": 1},
        {k: v for k, v in call.items() if k != "error"},
    ]
    assert not any(calls.kept(c) for c in refused)
    assert calls.stub(EventType.USAGE, {"call": call, "totals": {}}) is not None
    assert calls.stub(EventType.USAGE, {"call": call, "storedIn": "x"}) is None
    assert calls.stub("note", {"call": call}) is None


async def test_a_run_cannot_be_created_with_a_kept_call_among_its_first_events(
    pool: Pool,
) -> None:
    """The creating statement runs no store hook: the call's row would be missing."""
    async with pool.connection() as conn:
        with pytest.raises(ValueError, match="report no model call"):
            await append_creating(
                conn, "run_never", [NewEvent(EventType.RUN_CREATED, {}), usage_event("mc")], "", {}
            )
