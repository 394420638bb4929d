"""What a notification on the events channel says: a pointer, or the batch itself.

An append NOTIFYs `agentrt_events` with `<run id>:<last seq>` (a pointer: "the log grew, read
it"), or, when the batch fits in a notification, with the batch itself::

    <run id>:<last seq>
    <ts, as on the wire>
    <seq> <type> <data>
    ...

one line per event, oldest first, where `<data>` is Postgres's own jsonb text of the stored
row, as a replay reads it (`data::text`), so that a frame built from a carried line is
byte-identical to the frame a replay builds. jsonb text never holds a raw line feed (control
characters are escaped), so lines split on line feeds only (not `str.splitlines`, which
also splits on U+2028 and the like, which jsonb text keeps raw).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

# Postgres refuses a payload of NOTIFY_PAYLOAD_MAX_LENGTH bytes or more (BLCKSZ - NAMEDATALEN
# - 128: 8000 bytes by default), failing the statement; computed from the server's settings.
NOTIFY_LIMIT_SQL = (
    "(current_setting('block_size')::int - current_setting('max_identifier_length')::int - 1 - 128)"
)


def stamp(ts: datetime) -> str:
    """Return an event's `ts` as the wire has it: UTC, microseconds, `Z`."""
    return ts.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def wire_event(run_id: str, seq: int, kind: str, ts: str, data_json: str) -> str:
    """Build the wire JSON of an event; `ts` is already stamped, `data_json` is JSON text."""
    return f'{{"seq":{seq},"type":"{kind}","runId":"{run_id}","ts":"{ts}","data":{data_json}}}'


def pointer(run_id: str, last_seq: int) -> str:
    """Return the payload that only says the run's log grew up to `last_seq`."""
    return f"{run_id}:{last_seq}"


def carried_head(run_id: str, last_seq: int, ts: datetime) -> str:
    """Return the first two lines of a carrying payload; the append adds one line per event."""
    return f"{run_id}:{last_seq}\n{stamp(ts)}\n"


def run_of(payload: str) -> str:
    """Return the run a payload of the events channel is about."""
    return payload.partition("\n")[0].rpartition(":")[0]


def last_seq(payload: str) -> int | None:
    """Return the last seq a payload of the events channel announces (None if unreadable)."""
    seq = payload.partition("\n")[0].rpartition(":")[2]
    return int(seq) if seq.isdigit() else None


@dataclass(frozen=True)
class CarriedBatch:
    """The events a notification carries, as (seq, type, wire JSON), oldest first."""

    run_id: str
    events: list[tuple[int, str, str]]

    @property
    def first(self) -> int:
        """The seq of the batch's first event."""
        return self.events[0][0]

    @property
    def last(self) -> int:
        """The seq of the batch's last event."""
        return self.events[-1][0]


def carried(payload: str) -> CarriedBatch | None:
    """Return the batch a payload carries; None for a pointer (or anything unexpected)."""
    head, sep, rest = payload.partition("\n")
    if not sep:
        return None
    ts, sep, body = rest.partition("\n")
    run_id, _, last = head.rpartition(":")
    if not sep or not body or not last.isdigit():
        return None
    events = []
    try:
        for line in body.split("\n"):
            seq, kind, data = line.split(" ", 2)
            events.append((int(seq), kind, wire_event(run_id, int(seq), kind, ts, data)))
    except ValueError:
        return None
    if events[-1][0] != int(last) or events[-1][0] - events[0][0] != len(events) - 1:
        return None
    return CarriedBatch(run_id, events)
