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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphs.events import EventType
from server import jsontext
from server.events import manifests

# The key that marks a stub in the log, as for a manifest's.
STUB_KEY = manifests.STUB_KEY
TABLE = "messages"


class KeptAnswer(dict[str, Any]):
    """`run.completed`'s data, whose answer the message `outputMessageId` holds exactly."""


def kept_answer(message_id: str, output: str) -> KeptAnswer:
    """The data of a `run.completed` whose message, stored with it, holds `output`."""
    return KeptAnswer(outputMessageId=message_id, output=output)


def stub(kind: str, data: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return (the stub's JSON text, the whole data's) for an event kept so, else None."""
    if (
        kind != EventType.RUN_COMPLETED
        or not isinstance(data, KeptAnswer)
        or not isinstance(data.get("output"), str)
        or not isinstance(data.get("outputMessageId"), str)
        or STUB_KEY in data
    ):
        return None
    rest = {k: v for k, v in data.items() if k != "output"}
    return jsontext.dumps({**rest, STUB_KEY: TABLE}), jsontext.dumps(data)


# An event's data as it was appended, for a read of `run_events` aliased `e`, when it is a
# stub (a `WHEN` of `EVENT_DATA` in server/events/log.py): the answer comes back from the
# message by its key; if the message is gone, the stub is what there is.
EVENT_DATA = f"""WHEN e.type = '{EventType.RUN_COMPLETED.value}' AND e.data ? '{STUB_KEY}'
    THEN COALESCE((SELECT (e.data - '{STUB_KEY}') || jsonb_build_object('output', m.content)
        FROM {TABLE} m WHERE m.id = e.data ->> 'outputMessageId'), e.data)"""
