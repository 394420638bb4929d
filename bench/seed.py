"""Runs stored straight into the tables, for benchmarks and tests that read long logs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from graphs.events import EventType as E
from server.events.snapshot import apply_event, empty_snapshot
from server.ids import new_id


async def seed_conversation(
    conn: psycopg.AsyncConnection[Any], conv: str, msg: str, tenant: str, user: str, text: str
) -> None:
    """Insert conversation `conv` holding one user message `msg` that says `text`."""
    await conn.execute(
        "INSERT INTO conversations (id, tenant_id, user_id) VALUES (%s, %s, %s)",
        (conv, tenant, user),
    )
    await conn.execute(
        "INSERT INTO messages (id, conversation_id, tenant_id, user_id, role, content)"
        " VALUES (%s, %s, %s, %s, 'user', %s)",
        (msg, conv, tenant, user, text),
    )


async def seed_long_run(
    conn: psycopg.AsyncConnection[Any], tenant: str, user: str, events: int
) -> str:
    """Store a completed run of `events` events (one answer, a delta per character); its id.

    The snapshot is the fold of the same events with the deltas taken as one, which gives the
    same snapshot as folding them one by one.
    """
    run_id, conv, msg = new_id("run"), new_id("conv"), new_id("msg")
    deltas = events - 5
    text = "".join("abcdefghij"[n % 10] for n in range(deltas))
    item = "item_long"
    start = datetime.now(UTC) - timedelta(minutes=5)
    step = timedelta(minutes=4) / events
    head = [
        (
            E.RUN_CREATED,
            {
                "conversationId": conv,
                "model": "scripted:long",
                "modelSource": "request",
                "agent": "default@0",
                "inputMessageId": msg,
            },
        ),
        (E.RUN_STARTED, {"attempt": 1, "worker": "bench", "traceId": "0" * 32}),
        (E.MESSAGE_ITEM_CREATED, {"itemId": item, "role": "assistant", "node": "call_model"}),
    ]
    tail = [
        (
            E.MESSAGE_ITEM_COMPLETED,
            {"itemId": item, "status": "completed", "text": text, "reason": None},
        ),
        (E.RUN_COMPLETED, {"outputMessageId": None, "output": text}),
    ]
    snap = empty_snapshot(run_id)
    folded = [*head, (E.MESSAGE_ITEM_DELTA, {"itemId": item, "delta": text}), *tail]
    for seq, (kind, data) in enumerate(folded, start=1):
        apply_event(snap, seq, kind.value, data)
    snap["lastEventId"] = events
    await seed_conversation(conn, conv, msg, tenant, user, "write a long answer")
    await conn.execute(
        "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id,"
        " status, attempt, last_event_seq, created_at, started_at, finished_at,"
        " updated_at) VALUES (%s, %s, %s, %s, 'scripted:long', %s, 'completed', 1, %s,"
        " %s, %s, %s, %s)",
        (
            run_id,
            conv,
            tenant,
            user,
            msg,
            events,
            start,
            start,
            start + timedelta(minutes=4),
            start + timedelta(minutes=4),
        ),
    )
    await conn.execute(
        "INSERT INTO run_snapshots (run_id, seq, snapshot_text) VALUES (%s, %s, %s::json)",
        (run_id, events, Jsonb(snap)),
    )
    rows = [*head, *((E.MESSAGE_ITEM_DELTA, {"itemId": item, "delta": c}) for c in text), *tail]
    async with (
        conn.cursor() as cur,
        cur.copy("COPY run_events (run_id, seq, type, ts, attempt, data) FROM STDIN") as copy,
    ):
        for seq, (kind, data) in enumerate(rows, start=1):
            await copy.write_row((run_id, seq, kind.value, start + step * seq, 1, json.dumps(data)))
    return run_id
