"""Rows kept beside the event log are written by the appender's hooks, in the same transaction.

A `usage` event whose call its ledger row gives back exactly is stored as a stub, and the
append writes the row itself (server/events/calls.py); the row of any other is written only
when the appender hands in the ledger's hook, as a worker's event writer does.
"""

from __future__ import annotations

from typing import Any

import pytest

from graphs.events import EventType, ModelCall
from server.db.pool import Pool
from server.events.log import NewEvent, StoreHook, append_events, load_head
from server.events.writer import EventWriter
from server.usage.ledger import MODEL_CALLS
from tests.integration.test_eventlog import claim, new_run


def usage_event(call_id: str) -> NewEvent:
    call: ModelCall = {
        "callId": call_id,
        "step": 1,
        "attempt": 1,
        "modelId": "scripted:x",
        "provider": "scripted",
        "model": "x",
        "requestedModel": "scripted:x",
        "fallbackIndex": 0,
        "status": "ok",
        "latencyMs": 1.5,
        "ttftMs": 0.5,
        "itemId": "item",
        "finishReason": "stop",
        "inputTokens": 3,
        "outputTokens": 4,
        "cachedInputTokens": 0,
        "reasoningTokens": 0,
        "totalTokens": 7,
        "cost": "0",
        "priceSource": "local",
        "errorClass": None,
        "statusCode": None,
        "error": None,
    }
    totals = {"inputTokens": 3, "outputTokens": 4, "modelCalls": 1}
    return NewEvent(EventType.USAGE, {"call": call, "totals": totals})


async def ledger_rows(pool: Pool, run_id: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id, event_seq, total_tokens FROM model_calls WHERE run_id = %s", (run_id,)
        )
        return await cur.fetchall()


async def test_a_worker_writer_stores_model_call_rows_with_its_usage_events(pool: Pool) -> None:
    run_id = await new_run(pool)
    await claim(pool, run_id)
    async with pool.connection() as conn:
        head = await load_head(conn, run_id, lock=False)
    writer = EventWriter(pool, head, hooks=[MODEL_CALLS])
    writer.emit(EventType.USAGE, usage_event("mc_writer").data)
    await writer.close()

    assert await ledger_rows(pool, run_id) == [
        {"id": "mc_writer", "event_seq": head.seq + 1, "total_tokens": 7}
    ]


async def test_the_log_alone_stores_a_kept_call_with_its_row_and_another_without(
    pool: Pool,
) -> None:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)
    odd = usage_event("mc_odd")
    odd.data["call"]["retries"] = 2  # a field the ledger has no column for: stored whole
    async with pool.connection() as conn:
        head, _ = await append_events(
            conn, run_id, [usage_event("mc_bare"), odd], generation=generation
        )

    # The call kept in its row only is written by the append itself, hook or none.
    assert await ledger_rows(pool, run_id) == [
        {"id": "mc_bare", "event_seq": head.seq - 1, "total_tokens": 7}
    ]
    assert head.snapshot["usage"]["modelCalls"] == 1


async def test_a_failing_hook_stores_no_event_of_its_batch(pool: Pool) -> None:
    run_id = await new_run(pool)
    generation = await claim(pool, run_id)

    async def refuse(cur: Any, run: str, events: Any) -> None:
        raise RuntimeError("the derived rows could not be written")

    broken = StoreHook(frozenset({EventType.USAGE}), refuse)
    async with pool.connection() as conn:
        before = await load_head(conn, run_id, lock=False)
        with pytest.raises(RuntimeError):
            await append_events(
                conn, run_id, [usage_event("mc_lost")], generation=generation, hooks=[broken]
            )
        after = await load_head(conn, run_id, lock=False)
    assert after.seq == before.seq
