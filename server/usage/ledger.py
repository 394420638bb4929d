"""The usage ledger: model call rows, per-run breakdowns and daily aggregates.

Rows come from `usage` events, in the transaction that stores them. The append writes the
row of a call kept in its row only, its event a stub (server/events/calls.py `HOOK`); the
`MODEL_CALLS` hook, which a worker hands its appends, writes the row of any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from decimal import Decimal
from typing import Any, Literal

from psycopg import AsyncCursor

from graphs.events import EventType
from nodes.models.usage import money
from server.events import calls
from server.events.log import StoredEvent, StoreHook

# Also the columns the ledger added for calls kept in their rows only (item id, error).
_INSERT = f"""
INSERT INTO model_calls ({calls.COLUMNS})
SELECT {calls.VALUES}
FROM runs r WHERE r.id = %(runId)s
ON CONFLICT (id) DO NOTHING
"""


async def store_model_calls(
    cur: AsyncCursor[Any], run_id: str, events: Sequence[StoredEvent]
) -> None:
    """Insert a ledger row for every `usage` event among `events`."""
    rows = []
    for ev in events:
        call = ev.data.get("call") if ev.type == EventType.USAGE else None
        # A call kept in its row only, the append wrote the row (server/events/calls.py).
        if not call or calls.keeps(ev.type, ev.data):
            continue
        row = {k: call.get(k) for k in calls.FIELDS}
        row.update(callId=call["callId"], seq=ev.seq, ts=ev.ts, runId=run_id)
        row["fallbackIndex"] = row["fallbackIndex"] or 0
        rows.append(row)
    if rows:
        await cur.executemany(_INSERT, rows)


# Hand to the appender of a run's events: the model-call rows of its `usage` events.
MODEL_CALLS = StoreHook(frozenset({EventType.USAGE}), store_model_calls)


def call_view(row: dict[str, Any]) -> dict[str, Any]:
    """Render a ledger row for the API (money as a decimal string)."""
    return {
        "callId": row["id"],
        "eventSeq": row["event_seq"],
        "step": row["step"],
        "attempt": row["attempt"],
        "provider": row["provider"],
        "model": row["model"],
        "modelId": row["model_id"],
        "requestedModel": row["requested_model"],
        "fallbackIndex": row["fallback_index"],
        "status": row["status"],
        "inputTokens": row["input_tokens"],
        "outputTokens": row["output_tokens"],
        "cachedInputTokens": row["cached_input_tokens"],
        "reasoningTokens": row["reasoning_tokens"],
        "totalTokens": row["total_tokens"],
        "latencyMs": row["latency_ms"],
        "ttftMs": row["ttft_ms"],
        "cost": money(row["cost"]),
        "priceSource": row["price_source"],
        "finishReason": row["finish_reason"],
        "errorClass": row["error_class"],
        "statusCode": row["status_code"],
        "createdAt": row["created_at"].isoformat(),
    }


async def run_calls(conn: Any, run_id: str) -> list[dict[str, Any]]:
    """Return a run's ledger rows in call order."""
    cur = await conn.execute(
        "SELECT * FROM model_calls WHERE run_id = %s ORDER BY event_seq", (run_id,)
    )
    return [call_view(r) for r in await cur.fetchall()]


GroupBy = Literal["tenant", "user"]

_AGGREGATE = """
SELECT (created_at AT TIME ZONE 'UTC')::date AS day, {key} AS key,
    count(*) AS model_calls,
    count(*) FILTER (WHERE status = 'failed') AS failed_model_calls,
    count(DISTINCT run_id) AS runs,
    coalesce(sum(input_tokens), 0) AS input_tokens,
    coalesce(sum(output_tokens), 0) AS output_tokens,
    coalesce(sum(cached_input_tokens), 0) AS cached_input_tokens,
    coalesce(sum(reasoning_tokens), 0) AS reasoning_tokens,
    coalesce(sum(total_tokens), 0) AS total_tokens,
    coalesce(sum(cost), 0) AS known_cost,
    count(*) FILTER (WHERE status = 'ok' AND cost IS NULL) AS unpriced_calls
FROM model_calls
WHERE tenant_id = %(tenant)s
  AND created_at >= %(start)s::date AT TIME ZONE 'UTC'
  AND created_at < (%(end)s::date + 1) AT TIME ZONE 'UTC'
  AND (%(user)s::text IS NULL OR user_id = %(user)s)
GROUP BY 1, 2 ORDER BY 1, 2
"""


async def daily_usage(
    conn: Any, tenant_id: str, start: date, end: date, group_by: GroupBy, user_id: str | None
) -> list[dict[str, Any]]:
    """Aggregate the tenant's ledger by UTC day, for the tenant or per user."""
    key = "tenant_id" if group_by == "tenant" else "user_id"
    cur = await conn.execute(
        _AGGREGATE.format(key=key),
        {"tenant": tenant_id, "start": start, "end": end, "user": user_id},
    )
    out = []
    for r in await cur.fetchall():
        known: Decimal = r["known_cost"]
        out.append(
            {
                "day": r["day"].isoformat(),
                ("tenantId" if group_by == "tenant" else "userId"): r["key"],
                "runs": r["runs"],
                "modelCalls": r["model_calls"],
                "failedModelCalls": r["failed_model_calls"],
                "inputTokens": int(r["input_tokens"]),
                "outputTokens": int(r["output_tokens"]),
                "cachedInputTokens": int(r["cached_input_tokens"]),
                "reasoningTokens": int(r["reasoning_tokens"]),
                "totalTokens": int(r["total_tokens"]),
                "cost": None if r["unpriced_calls"] else money(known),
                "knownCost": money(known),
                "unpricedCalls": r["unpriced_calls"],
            }
        )
    return out
