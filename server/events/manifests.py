"""A model call's manifest, kept once: in `context_manifests`, with a stub in the event log.

A `context.built` event carries the manifest of the next model call (what went into its
context, and why). The manifest outlives the log (retention drops events, not the run's
manifests), so it is stored in `context_manifests`, in the append's transaction; the log
stores a stub in the event's place (`stub_text`), and every read of the log that returns data puts
the manifest back (`EVENT_DATA`). Live frames carry the manifest as the append stored it in
its table, so a live stream and a replay stay byte-identical (docs/decisions/2039).

The table keeps the manifest as the compact JSON text the append sent (`manifest_text`,
`json`), smaller than its `jsonb`; rows stored before keep `jsonb` (`manifest`). The text
leaves out the keys the row's own columns hold (`kept_text`). Readers take `stored`, which
is the whole manifest as `jsonb` either way (docs/decisions/2041, 2046).

An event whose data has no integer `step` is not a manifest the table can key: it is stored
as it is, with no row beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphs.events import EventType
from server import jsontext

# The key that marks a stub (a manifest's, a call's, an answer's); a reader puts back what the
# stub stands for only where it is present, so the events stored whole before (with a copy in
# the table) are read as they were stored.
STUB_KEY = "storedIn"
TABLE = "context_manifests"


def stub_text(kind: str, data: Mapping[str, Any]) -> str | None:
    """Return the JSON text the log stores in place of the event's data, or None to keep it.

    Kept whole, with no row in the table, is a manifest whose values its row's integer
    columns cannot take (`_fits`): its append would fail, and its run with it.
    """
    step = data.get("step")
    if kind != EventType.CONTEXT_BUILT or not _int(step) or not _fits(data):
        return None
    stub: dict[str, Any] = {"step": step, STUB_KEY: TABLE}
    if isinstance(data.get("attempt"), int):
        stub["attempt"] = data["attempt"]
    return jsontext.dumps(stub)


# The manifest's keys its row's columns give back exactly (`kept_text`), each with the test
# of a value that a column reproduces, and the SQL that rebuilds it from the row `{m}`.
_INT32 = range(-(2**31), 2**31)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value in _INT32


def _int_or_none(value: Any) -> bool:
    return value is None or _int(value)


def _fits(data: Mapping[str, Any]) -> bool:
    """Whether the row's integer columns take the manifest's values (`insert_sql`'s casts).

    A custom context builder may count tokens as a float, say: that manifest stays whole in
    the log instead of failing its append.
    """
    profile = data.get("profile")
    return all(_int_or_none(data.get(key)) for key in ("attempt", "window", "totalTokens")) and (
        not isinstance(profile, Mapping) or _int_or_none(profile.get("version"))
    )


_COLUMNS: dict[str, tuple[Any, str]] = {
    "step": (_int, "{m}.step"),
    "attempt": (_int, "{m}.attempt"),
    "model": (lambda v: isinstance(v, str), "{m}.model"),
    "profile": (
        lambda v: (
            isinstance(v, dict)
            and v.keys() == {"name", "version"}
            and isinstance(v["name"], str)
            and _int(v["version"])
        ),
        "jsonb_build_object('name', {m}.agent_name, 'version', {m}.agent_version)",
    ),
    "window": (_int, "{m}.window_tokens"),
    "totalTokens": (_int, "{m}.total_tokens"),
}


def kept_text(data: Mapping[str, Any]) -> str | None:
    """The JSON text the table keeps of a manifest whose row's columns hold some of it.

    Its step, attempt, model, profile, window and total tokens are the row's columns too:
    when the columns give back all six exactly, the table keeps the rest of the manifest
    only, and `stored` puts them back (docs/decisions/2046). None when any is missing or
    out of a column's reach: the table keeps the whole text.
    """
    if not all(key in data and test(data[key]) for key, (test, _) in _COLUMNS.items()):
        return None
    return jsontext.dumps({k: v for k, v in data.items() if k not in _COLUMNS})


def stored(m: str = TABLE) -> str:
    """A row's manifest as `jsonb`, whichever form the row `m` (a table alias) holds.

    Rows stored before keep `jsonb` (`manifest`); the others the text the append sent
    (`manifest_text`), whole or, when it has no `step`, without the keys the columns give
    back (`kept_text`), which are put back first so that the text's own keys win.
    """
    columns = ", ".join(f"'{key}', {sql.format(m=m)}" for key, (_, sql) in _COLUMNS.items())
    return (
        f"COALESCE({m}.manifest, (SELECT CASE WHEN t ? 'step' THEN t"
        f" ELSE jsonb_build_object({columns}) || t END"
        f" FROM (SELECT {m}.manifest_text::jsonb AS t) AS kept))"
    )


def insert_sql(source: str, where: str, run: str, tenant: str) -> str:
    """An `INSERT` of the manifests of a batch's rows `b` in `source`.

    `b` has `seq`, `manifest` (the manifest parsed, `jsonb`) and `manifest_text` (the JSON
    text the row keeps: the manifest's as the append sent it, or `kept_text`'s).

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
    THEN COALESCE((SELECT {stored("m")} FROM {TABLE} m
        WHERE m.run_id = e.run_id AND m.event_seq = e.seq), e.data)"""
