"""A model call's manifest, kept once: in `context_manifests`, with a stub in the event log.

A `context.built` event carries the manifest of the next model call (what went into its
context, and why). The manifest outlives the log (retention drops events, not the run's
manifests), so it is stored in `context_manifests`, in the append's transaction; the log
stores a stub in the event's place (`stub_text`), and every read of the log that returns data puts
the manifest back (`EVENT_DATA`). Live frames carry the manifest as the append stored it in
its table, so a live stream and a replay stay byte-identical (docs/decisions/2039).

The table keeps the manifest as the compact JSON text the append sent (`manifest_text`,
`json`), smaller than its `jsonb`; rows stored before keep `jsonb` (`manifest`). Readers
take `STORED`, which is `jsonb` either way (docs/decisions/2041).

An event whose data has no integer `step` is not a manifest the table can key: it is stored
as it is, with no row beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphs.events import EventType
from server import jsontext

# The key that marks a stub; a reader puts back the manifest only where it is present, so the
# events stored whole before (with a copy in the table) are read as they were stored.
STUB_KEY = "storedIn"
TABLE = "context_manifests"


def stub_text(kind: str, data: Mapping[str, Any]) -> str | None:
    """Return the JSON text the log stores in place of the event's data, or None to keep it."""
    step = data.get("step")
    if kind != EventType.CONTEXT_BUILT or not isinstance(step, int) or isinstance(step, bool):
        return None
    stub: dict[str, Any] = {"step": step, STUB_KEY: TABLE}
    if isinstance(data.get("attempt"), int):
        stub["attempt"] = data["attempt"]
    return jsontext.dumps(stub)


# A row's manifest as `jsonb`, whichever form the row holds.
STORED = "COALESCE(manifest, manifest_text::jsonb)"


def insert_sql(source: str, where: str, run: str, tenant: str) -> str:
    """An `INSERT` of the manifests of a batch's rows `b` in `source`.

    `b` has `seq`, `manifest` (the manifest parsed, `jsonb`) and `manifest_text` (its JSON
    text as the append sent it, which the row keeps).

    `where` narrows `source`; `run` and `tenant` are the SQL of the run's id and tenant;
    `%(attempt)s` (the attempt when a manifest names none) and `%(ts)s` (the batch's time)
    are the append's parameters.
    """
    return f"""
INSERT INTO {TABLE} (run_id, step, attempt, event_seq, tenant_id, model, agent_name,
    agent_version, window_tokens, total_tokens, manifest_text, created_at)
SELECT {run}, (b.manifest->>'step')::integer,
    COALESCE((b.manifest->>'attempt')::integer, %(attempt)s), b.seq, {tenant},
    b.manifest->>'model', b.manifest->'profile'->>'name',
    (b.manifest->'profile'->>'version')::integer, (b.manifest->>'window')::integer,
    (b.manifest->>'totalTokens')::integer, b.manifest_text::json, %(ts)s
FROM {source} WHERE {where} AND b.manifest IS NOT NULL
"""


# An event's data as it was appended, for a read of `run_events` aliased `e`, when it is a
# stub (a `WHEN` of `EVENT_DATA` in server/events/log.py): its manifest comes back from its
# table by the event's key (an index lookup, for these events only); if the row is gone
# (erased), the stub is what there is.
EVENT_DATA = f"""WHEN e.type = '{EventType.CONTEXT_BUILT.value}' AND e.data ? '{STUB_KEY}'
    THEN COALESCE((SELECT {STORED} FROM {TABLE} m
        WHERE m.run_id = e.run_id AND m.event_seq = e.seq), e.data)"""
