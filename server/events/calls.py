"""A model call's record, kept once: in its ledger row, with a stub in the event log.

A `usage` event reports one model call (`call`, the ledger's fields) and the run's new
totals. The append that stores it writes the call's ledger row (`model_calls`) in its
transaction (`HOOK`), and the log keeps a stub in the event's place (`stub`): the event's
other keys, `"storedIn": "model_calls"` and the call's id. Every read of the log that returns
data puts the call back, built from the row (`agentrt_model_call`, migration 0046); live
frames carry the data with the call's numbers as the row gives them back, so a live stream
and a replay stay byte-identical (docs/decisions/2042).

Only a call the row gives back exactly is kept so: its fields are the ledger's, each of the
type its column holds, its cost a decimal of at most ten places written as `money` writes
it. Any other `usage` event is stored whole, and the usage ledger's store hook writes its
row as before (`server/usage/ledger.py`).

A stub also leaves out the zeros of the run's totals, when they are the totals a run keeps
(`RunTotals`: its keys, each zero written as `RunTotals` writes it): it keeps the others
as `nonzeroTotals`, and reads put the zeros back (`totals_of`, `agentrt_usage_totals`,
migration 0051; docs/decisions/2051).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from psycopg import AsyncCursor

from graphs.events import EventType
from nodes.models.usage import RunTotals
from server import jsontext
from server.events import manifests
from server.events.store import StoredEvent, StoreHook

# The key that marks a stub in the log, as for a manifest's.
STUB_KEY = manifests.STUB_KEY
TABLE = "model_calls"
ID_KEY = "callId"

# A stub's totals without their zeros: present instead of `totals` when the totals were a run's
# (`RunTotals`), and the zeros, each written as `RunTotals` writes it, are what was left out.
NONZERO_KEY = "nonzeroTotals"
ZERO_TOTALS: Mapping[str, Any] = RunTotals().to_json()

# The call's fields, by the kind of value each column takes.
_TEXT_REQUIRED = ("callId", "modelId", "provider", "model", "requestedModel")
_TEXT = ("itemId", "finishReason", "priceSource", "errorClass", "error")
_INT_REQUIRED = ("step", "attempt", "fallbackIndex")
_INT = ("inputTokens", "outputTokens", "cachedInputTokens", "reasoningTokens", "totalTokens")
_OTHER = ("status", "latencyMs", "ttftMs", "cost", "statusCode")
# Every field of a call, which the ledger's columns hold.
FIELDS = frozenset((*_TEXT_REQUIRED, *_TEXT, *_INT_REQUIRED, *_INT, *_OTHER))
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
        and call.keys() == FIELDS
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
        and NONZERO_KEY not in data  # a read would take it for the stub's
        and kept(data.get("call"))
    )


def _is_zero(key: str, value: Any) -> bool:
    zero = ZERO_TOTALS[key]
    return type(value) is type(zero) and value == zero


def without_zeros(totals: Any) -> dict[str, Any] | None:
    """`totals` without its zeros, if they are a run's totals whose zeros `totals_of` restores.

    None when they are not: other keys, or a key missing, and they are stored whole.
    """
    if not isinstance(totals, Mapping) or totals.keys() != ZERO_TOTALS.keys():
        return None
    return {k: v for k, v in totals.items() if not _is_zero(k, v)}


def totals_of(data: Mapping[str, Any]) -> Any:
    """A `usage` event's totals, as appended: a stub's with its zeros put back."""
    nonzero = data.get(NONZERO_KEY)
    if STUB_KEY in data and isinstance(nonzero, Mapping) and "totals" not in data:
        return {k: nonzero.get(k, zero) for k, zero in ZERO_TOTALS.items()}
    return data.get("totals", {})


def _as_stored(value: Any) -> Any:
    """A latency as the row gives it back: a whole number of milliseconds has no `.0`."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def stub(kind: str, data: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return (the stub's JSON text, the whole data's) for an event kept so, else None.

    The whole data is what a read of the log gives back, which live frames carry: the call
    with its numbers as its row gives them back.
    """
    if not keeps(kind, data):
        return None
    call = dict(data["call"])
    call["latencyMs"] = _as_stored(call["latencyMs"])
    call["ttftMs"] = _as_stored(call["ttftMs"])
    rest = {k: v for k, v in data.items() if k != "call"}
    nonzero = without_zeros(rest.get("totals"))
    if nonzero is not None:
        del rest["totals"]
        rest[NONZERO_KEY] = nonzero
    return (
        jsontext.dumps({**rest, STUB_KEY: TABLE, ID_KEY: call[ID_KEY]}),
        jsontext.dumps({**data, "call": call}),
    )


# The ledger's columns, and their values from a call's fields (`%(field)s`), the event's seq
# and time (`%(seq)s`, `%(ts)s`) and the run's row `r`; the usage ledger's hook shares them.
COLUMNS = """id, run_id, event_seq, tenant_id, user_id, conversation_id, step, attempt, provider,
    model, model_id, requested_model, fallback_index, status, input_tokens, output_tokens,
    cached_input_tokens, reasoning_tokens, total_tokens, latency_ms, ttft_ms, cost,
    price_source, finish_reason, error_class, status_code, item_id, error, created_at"""
VALUES = """%(callId)s, r.id, %(seq)s, r.tenant_id, r.user_id, r.conversation_id, %(step)s,
    %(attempt)s, %(provider)s, %(model)s, %(modelId)s, %(requestedModel)s, %(fallbackIndex)s,
    %(status)s, %(inputTokens)s, %(outputTokens)s, %(cachedInputTokens)s, %(reasoningTokens)s,
    %(totalTokens)s, %(latencyMs)s, %(ttftMs)s, %(cost)s::numeric, %(priceSource)s,
    %(finishReason)s, %(errorClass)s, %(statusCode)s, %(itemId)s, %(error)s, %(ts)s"""

# A kept call's row. A test of the key, not `ON CONFLICT`: a speculative insertion writes a
# second WAL record per row, and no two appends store one call (each call has its own id,
# and a batch written again after a commit in doubt is refused by the run's head first).
_INSERT = f"""
INSERT INTO {TABLE} ({COLUMNS})
SELECT {VALUES}
FROM runs r WHERE r.id = %(runId)s
  AND NOT EXISTS (SELECT FROM {TABLE} o WHERE o.id = %(callId)s)
"""


async def _store_kept(cur: AsyncCursor[Any], run_id: str, events: Sequence[StoredEvent]) -> None:
    rows = [
        {**ev.data["call"], "seq": ev.seq, "ts": ev.ts, "runId": run_id}
        for ev in events
        if keeps(ev.type, ev.data)
    ]
    if rows:
        await cur.executemany(_INSERT, rows)


# The rows of the calls kept so, which the append writes with their events (in their
# transaction, as every store hook's), whatever hooks its caller hands in.
HOOK = StoreHook(frozenset({EventType.USAGE}), _store_kept)


# An event's data as it was appended, for a read of `run_events` aliased `e`, when it is a
# stub (a `WHEN` of `EVENT_DATA` in server/events/log.py): the call comes back from its row
# by its id, the totals' zeros from `agentrt_usage_totals`; if the row is gone, the stub
# with its totals is what there is.
EVENT_DATA = f"""WHEN e.type = '{EventType.USAGE.value}' AND e.data ? '{STUB_KEY}'
    THEN COALESCE((SELECT agentrt_usage_data(e.data, m) FROM {TABLE} m
        WHERE m.id = e.data ->> '{ID_KEY}'), agentrt_usage_totals(e.data))"""
