"""A model call's record, kept once: in its ledger row, with a stub in the event log.

A `usage` event reports one model call (`call`, the ledger's fields) and the run's new
totals. The append that stores it writes the call's ledger row (`model_calls`) in its own
statement, and the log keeps a stub in the event's place (`stub`): the event's other keys,
`"storedIn": "model_calls"` and the call's id. Every read of the log that returns data puts
the call back, built from the row (`agentrt_model_call`, migration 0046), and live frames
carry what that builds from the row the append stored, so a live stream and a replay stay
byte-identical (docs/decisions/2042).

Only a call the row gives back exactly is kept so: its fields are the ledger's, each of the
type its column holds, its cost a decimal of at most ten places written as `money` writes
it. Any other `usage` event is stored whole, and the usage ledger's store hook writes its
row as before (`server/usage/ledger.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from graphs.events import EventType
from server import jsontext

STUB_KEY = "storedIn"
TABLE = "model_calls"
ID_KEY = "callId"

# The call's fields, by the kind of value each column takes.
_TEXT_REQUIRED = ("callId", "modelId", "provider", "model", "requestedModel")
_TEXT = ("itemId", "finishReason", "priceSource", "errorClass", "error")
_INT_REQUIRED = ("step", "attempt", "fallbackIndex")
_INT = ("inputTokens", "outputTokens", "cachedInputTokens", "reasoningTokens", "totalTokens")
_OTHER = ("status", "latencyMs", "ttftMs", "cost", "statusCode")
_FIELDS = frozenset((*_TEXT_REQUIRED, *_TEXT, *_INT_REQUIRED, *_INT, *_OTHER))
_INT_MAX = 2**31 - 1
# `numeric(20, 10)`: ten places, and below 10^10.
_COST_PLACES = Decimal("1e-10")
_COST_MAX = Decimal(10) ** 10
# Below 2^53 every integer is a float exactly, so `double precision` gives it back.
_LATENCY_MAX = 2.0**53


def _is_int(value: Any, required: bool) -> bool:
    if value is None:
        return not required
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _INT_MAX


def _is_text(value: Any, required: bool) -> bool:
    return isinstance(value, str) if required or value is not None else True


def _is_latency(value: Any, required: bool) -> bool:
    if value is None:
        return not required
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and abs(value) < _LATENCY_MAX


def _is_cost(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    try:
        cost = Decimal(value)
    except InvalidOperation:
        return False
    return (
        cost.is_finite()
        and abs(cost) < _COST_MAX
        and cost == cost.quantize(_COST_PLACES)
        # As `money` writes it, which is what the row's `trim_scale` gives back.
        and format(cost.normalize(), "f") == value
    )


def kept(call: Any) -> bool:
    """Say whether `call` (a `usage` event's) is one its ledger row gives back exactly."""
    return (
        isinstance(call, Mapping)
        and call.keys() == _FIELDS
        and all(_is_text(call[k], True) for k in _TEXT_REQUIRED)
        and all(_is_text(call[k], False) for k in _TEXT)
        and all(_is_int(call[k], True) for k in _INT_REQUIRED)
        and all(_is_int(call[k], False) for k in _INT)
        and _is_int(call["statusCode"], False)
        and call["status"] in ("ok", "failed")
        and _is_latency(call["latencyMs"], True)
        and _is_latency(call["ttftMs"], False)
        and _is_cost(call["cost"])
    )


def keeps(kind: str, data: Mapping[str, Any]) -> bool:
    """Say whether an event is stored as a stub, its call in the ledger row the append writes."""
    return (
        kind == EventType.USAGE
        and STUB_KEY not in data
        and ID_KEY not in data
        and kept(data.get("call"))
    )


def stub(kind: str, data: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return (the stub's JSON text, the call's) for an event kept so, or None to store it whole."""
    if not keeps(kind, data):
        return None
    call = data["call"]
    rest = {k: v for k, v in data.items() if k != "call"}
    return (
        jsontext.dumps({**rest, STUB_KEY: TABLE, ID_KEY: call[ID_KEY]}),
        jsontext.dumps(call),
    )


def rows_sql(source: str, where: str, run: str) -> str:
    """The ledger rows (`model_calls` records, `m`, with `seq`) of a batch's rows `b` in `source`.

    `b` has `seq` and `call` (the call, `jsonb`; NULL for an event stored whole); `run` is
    the SQL of the run's row (`id`, `tenant_id`, `user_id`, `conversation_id`); `%(ts)s` is
    the append's time, the row's `created_at`.
    """
    return f"""
SELECT b.seq, jsonb_populate_record(NULL::{TABLE}, jsonb_build_object(
    'id', b.call->'callId', 'run_id', {run}.id, 'event_seq', b.seq,
    'tenant_id', {run}.tenant_id, 'user_id', {run}.user_id,
    'conversation_id', {run}.conversation_id, 'step', b.call->'step',
    'attempt', b.call->'attempt', 'provider', b.call->'provider', 'model', b.call->'model',
    'model_id', b.call->'modelId', 'requested_model', b.call->'requestedModel',
    'fallback_index', b.call->'fallbackIndex', 'status', b.call->'status',
    'input_tokens', b.call->'inputTokens', 'output_tokens', b.call->'outputTokens',
    'cached_input_tokens', b.call->'cachedInputTokens',
    'reasoning_tokens', b.call->'reasoningTokens', 'total_tokens', b.call->'totalTokens',
    'latency_ms', b.call->'latencyMs', 'ttft_ms', b.call->'ttftMs', 'cost', b.call->'cost',
    'price_source', b.call->'priceSource', 'finish_reason', b.call->'finishReason',
    'error_class', b.call->'errorClass', 'status_code', b.call->'statusCode',
    'item_id', b.call->'itemId', 'error', b.call->'error', 'created_at', %(ts)s::timestamptz
)) AS m
FROM {source} WHERE {where} AND b.call IS NOT NULL
"""


# The rows of `rows_sql` (aliased `c`) stored; a call already in the ledger is left as it is.
# A test of the key, not `ON CONFLICT`: a speculative insertion writes a second WAL record
# per row, and no two appends store one call (each call has its own id, and a batch written
# again after a commit in doubt is refused by the run's head before it gets here).
INSERT = f"""INSERT INTO {TABLE} SELECT (c.m).* FROM calls c
WHERE NOT EXISTS (SELECT FROM {TABLE} o WHERE o.id = (c.m).id)"""


# An event's data as it was appended, for a read of `run_events` aliased `e`, when it is a
# stub: the call comes back from its row by its id; if the row is gone, the stub is what
# there is.
EVENT_DATA = f"""WHEN e.type = '{EventType.USAGE.value}' AND e.data ? '{STUB_KEY}'
    THEN COALESCE((SELECT agentrt_usage_data(e.data, m) FROM {TABLE} m
        WHERE m.id = e.data ->> '{ID_KEY}'), e.data)"""
