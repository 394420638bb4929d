"""A run's answer, kept once: in its message, with a stub in the log's `run.completed`.

`run.completed` carries the run's answer (`output`) and the id of the assistant message
that holds it (`outputMessageId`); the run's end inserts that message with the answer as
its content in the transaction that appends the event. The log keeps the event's other keys
and `"storedIn": "messages"` (`stub`), and every read of the log that returns data puts the
answer back from the message (`EVENT_DATA`). Live frames carry the whole data, so a live
stream and a replay stay byte-identical (docs/decisions/2050).

Only an event whose data the run's end made with `kept_answer` is kept so: that is the
appender's word that the message holds the answer exactly. Any other `run.completed` is
stored whole.

The answer's item is kept once too (`item_stubs`): a `message.item.completed` in the batch of
such a `run.completed` whose text is the answer, and is the text the item's deltas already
built, is stored without its text and with the message's id (`textMessageId`); reads put the
text back from the message, and a fold of the stub keeps the text the deltas built
(docs/decisions/2052).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from graphs.events import EventType
from server import jsontext
from server.events import manifests
from server.events.snapshot import Snapshot, apply_event, copy_snapshot, find_item
from server.events.store import StoredEvent

# The key that marks a stub in the log, as for a manifest's.
STUB_KEY = manifests.STUB_KEY
TABLE = "messages"
# The key of an item's stub that names the message holding its text.
ITEM_KEY = "textMessageId"


class KeptAnswer(dict[str, Any]):
    """`run.completed`'s data, whose answer the message `outputMessageId` holds exactly."""


def kept_answer(message_id: str, output: str) -> KeptAnswer:
    """The data of a `run.completed` whose message, stored with it, holds `output`."""
    return KeptAnswer(outputMessageId=message_id, output=output)


def _kept(kind: str, data: Mapping[str, Any]) -> bool:
    return (
        kind == EventType.RUN_COMPLETED
        and isinstance(data, KeptAnswer)
        and isinstance(data.get("output"), str)
        and isinstance(data.get("outputMessageId"), str)
        and STUB_KEY not in data
    )


def stub(kind: str, data: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return (the stub's JSON text, the whole data's) for an event kept so, else None."""
    if not _kept(kind, data):
        return None
    rest = {k: v for k, v in data.items() if k != "output"}
    return jsontext.dumps({**rest, STUB_KEY: TABLE}), jsontext.dumps(data)


def item_stubs(before: Snapshot, stored: Sequence[StoredEvent]) -> list[tuple[str, str] | None]:
    """For each event of a batch, (its stub's JSON text, its whole data's) if it is kept so.

    It is when it completes an item with the text of the batch's kept answer (`kept_answer`:
    the message stored in the batch's transaction holds it) and the fold of the events before
    it already gave the item that text, so a fold of the stub, which keeps the item's text,
    is the fold of the event. `before` is the snapshot the batch folds from.
    """
    found: list[tuple[str, str] | None] = [None] * len(stored)
    answer = next((e.data for e in stored if _kept(e.type, e.data)), None)
    if answer is None:
        return found
    output, message_id = answer["output"], answer["outputMessageId"]
    snapshot: Snapshot | None = None
    for n, e in enumerate(stored):
        data = e.data
        if (
            e.type == EventType.MESSAGE_ITEM_COMPLETED
            and data.get("text") == output
            and STUB_KEY not in data
            and ITEM_KEY not in data
        ):
            if snapshot is None:  # folded only for a batch that may keep an item
                snapshot = copy_snapshot(before)
                for earlier in stored[:n]:
                    apply_event(snapshot, earlier.seq, earlier.type, earlier.data)
            item = find_item(snapshot, data.get("itemId"))  # as the fold finds it
            if item is not None and item["text"] == output:
                rest = {k: v for k, v in data.items() if k != "text"}
                found[n] = (
                    jsontext.dumps({**rest, STUB_KEY: TABLE, ITEM_KEY: message_id}),
                    jsontext.dumps(data),
                )
        if snapshot is not None:
            apply_event(snapshot, e.seq, e.type, data)
    return found


# An event's data as it was appended, for a read of `run_events` aliased `e`, when it is a
# stub (a `WHEN` of `EVENT_DATA` in server/events/log.py): the answer, or the item's text,
# comes back from the message by its key; if the message is gone, the stub is what there is.
EVENT_DATA = f"""WHEN e.type = '{EventType.RUN_COMPLETED.value}' AND e.data ? '{STUB_KEY}'
    THEN COALESCE((SELECT (e.data - '{STUB_KEY}') || jsonb_build_object('output', m.content)
        FROM {TABLE} m WHERE m.id = e.data ->> 'outputMessageId'), e.data)
    WHEN e.type = '{EventType.MESSAGE_ITEM_COMPLETED.value}' AND e.data ? '{STUB_KEY}'
    THEN COALESCE((SELECT (e.data - '{STUB_KEY}' - '{ITEM_KEY}')
            || jsonb_build_object('text', m.content)
        FROM {TABLE} m WHERE m.id = e.data ->> '{ITEM_KEY}'), e.data)"""
