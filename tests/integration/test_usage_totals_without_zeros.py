"""A `usage` stub keeps the run's totals without their zeros; every read puts them back.

The stub of a model call kept in its ledger row leaves out the zeros of the run's totals when
they are a run's (`RunTotals`' keys, each zero as `RunTotals` writes it). Live frames, a
replay, a read of the log and a head folded from it give the totals back as appended, on
every append path; totals of any other shape are stored whole.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from graphs.events import EventType
from nodes.models.usage import RunTotals
from server.db.pool import Pool
from server.events import calls
from server.events.log import NewEvent, append_events, read_events
from server.events.notify import Notifier
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


def with_totals(call_id: str, totals: dict[str, Any]) -> NewEvent:
    event = usage_event(call_id)
    event.data["totals"] = totals
    return event


def run_totals(**fields: Any) -> dict[str, Any]:
    return RunTotals(**fields).to_json()


# Totals as a run writes them: mostly zeros, none, unpriced (a `null` cost), all set.
FIRST = run_totals(input_tokens=10, output_tokens=1, model_calls=1, tool_calls=1)
ZEROS = run_totals()
UNPRICED = run_totals(input_tokens=5, unpriced_calls=1, model_calls=1)
ALL_SET = run_totals(
    input_tokens=1,
    output_tokens=2,
    cached_input_tokens=3,
    reasoning_tokens=4,
    known_cost=Decimal("0.0012"),
    unpriced_calls=8,
    model_calls=5,
    failed_model_calls=6,
    tool_calls=7,
)


def test_the_zeros_left_out_are_a_runs_and_only_those() -> None:
    assert calls.without_zeros(FIRST) == {
        "inputTokens": 10,
        "outputTokens": 1,
        "totalTokens": 11,
        "modelCalls": 1,
        "toolCalls": 1,
    }
    assert calls.without_zeros(ZEROS) == {}
    assert calls.without_zeros(UNPRICED)["cost"] is None  # a null is not a zero
    assert calls.without_zeros(ALL_SET) == ALL_SET
    # Any other shape is kept whole: a key more or less, a zero of another type.
    assert calls.without_zeros({**FIRST, "extra": 0}) is None
    assert calls.without_zeros({k: v for k, v in FIRST.items() if k != "cost"}) is None
    assert calls.without_zeros([]) is None
    odd = {**ZEROS, "inputTokens": 0.0, "cost": 0, "toolCalls": False, "knownCost": "0.0"}
    assert calls.without_zeros(odd) == {
        k: odd[k] for k in ("inputTokens", "cost", "toolCalls", "knownCost")
    }
    # An event that has the stub's key of its own is stored whole: a read would take it for it.
    call = usage_event("mc").data["call"]
    assert calls.stub(EventType.USAGE, {"call": call, "nonzeroTotals": {}}) is None
    for totals in (FIRST, ZEROS, UNPRICED, ALL_SET, odd):
        stub_text, _ = calls.stub(EventType.USAGE, with_totals("mc", totals).data) or ("", "")
        stub = json.loads(stub_text)
        assert "totals" not in stub
        assert calls.totals_of(stub) == totals
        assert list(calls.totals_of(stub)) == list(totals)  # in the order a run writes them


async def test_the_zeros_the_database_puts_back_are_the_servers(pool: Pool) -> None:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT agentrt_usage_totals(%s::jsonb) -> 'totals' AS totals",
            (json.dumps({"storedIn": "model_calls", "nonzeroTotals": {}}),),
        )
        row = await cur.fetchone()
    assert row is not None and row["totals"] == calls.ZERO_TOTALS == RunTotals().to_json()


async def test_every_append_path_leaves_the_zeros_out_and_reads_put_them_back(
    pool: Pool, notifier: Notifier
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    tail, _ = await following(pool, notifier, run_id, start)
    notes = [NewEvent("note", {"n": n}) for n in range(80)]
    batches = [
        [with_totals("mc_1", FIRST)],  # one statement (no hook)
        [with_totals("mc_2", ZEROS), with_totals("mc_3", UNPRICED)],  # hooked: pipelined
        [with_totals("mc_4", ALL_SET), *notes],  # COPY
        [with_totals("mc_5", {**FIRST, "extra": 0})],  # another shape: kept whole
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

    rows = await stored_rows(pool, run_id, EventType.USAGE)
    by_call = {data["callId"]: data for data in rows.values()}
    assert sorted(by_call) == ["mc_1", "mc_2", "mc_3", "mc_4", "mc_5"]
    kept = {"mc_1": FIRST, "mc_2": ZEROS, "mc_3": UNPRICED, "mc_4": ALL_SET}
    for call_id, totals in kept.items():
        assert "totals" not in by_call[call_id]
        assert by_call[call_id]["nonzeroTotals"] == calls.without_zeros(totals)
    assert by_call["mc_5"]["totals"] == {**FIRST, "extra": 0}
    assert "nonzeroTotals" not in by_call["mc_5"]
    # The run's snapshot holds the last totals whole.
    assert head.snapshot["usage"] == {**FIRST, "extra": 0}

    # Live frames equal a replay byte for byte; reads and a folded head give back the totals.
    await assert_reads_give_back(pool, notifier, tail, head, start, appended)


async def test_a_stub_whose_row_is_gone_still_reads_with_its_totals(pool: Pool) -> None:
    run_id, generation, head = await started(pool)
    async with pool.connection() as conn:
        head, _ = await append_events(
            conn, run_id, [with_totals("mc_gone", FIRST)], generation=generation, head=head
        )
        await conn.execute("DELETE FROM model_calls WHERE id = 'mc_gone'")
        read = await read_events(conn, run_id, head.seq - 1, 9)
    assert json.loads(read[0][2])["data"] == {
        "totals": FIRST,
        "storedIn": "model_calls",
        "callId": "mc_gone",
    }
