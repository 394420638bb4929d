"""What a notification on the events channel says: a pointer, or the batch itself.

An append NOTIFYs `agentrt_events` with `<run id>:<last seq>` (a pointer: "the log grew, read
it"), or, when the batch fits in a notification, with the batch itself::

    <run id>:<last seq>
    <ts, as on the wire>
    <seq> <type> <data>
    ...

one line per event, oldest first, where `<data>` is Postgres's own jsonb text of the event's
data, as a replay reads it (`data::text`; a manifest's, for the stub the log keeps of a
`context.built` event, server/events/manifests.py), so that a frame built from a carried line is
byte-identical to the frame a replay builds. jsonb text never holds a raw line feed (control
characters are escaped), so lines split on line feeds only (not `str.splitlines`, which
also splits on U+2028 and the like, which jsonb text keeps raw).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from datetime import UTC, datetime

from server.domain import parse_seq

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
    return parse_seq(payload.partition("\n")[0].rpartition(":")[2])


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
    run_id, _, last_text = head.rpartition(":")
    last = parse_seq(last_text)
    if not sep or not body or last is None:
        return None
    events = []
    try:
        for line in body.split("\n"):
            seq, kind, data = line.split(" ", 2)
            events.append((int(seq), kind, wire_event(run_id, int(seq), kind, ts, data)))
    except ValueError:
        return None
    if events[-1][0] != last or events[-1][0] - events[0][0] != len(events) - 1:
        return None
    return CarriedBatch(run_id, events)


class RecentBatches:
    """The latest payloads of the events channel, per run, for streams that start afresh.

    A run's entry holds every notification heard for it since the entry began, in arrival
    (= commit) order; entries are dropped whole (least recently notified first), and all of
    them when the listener reconnects, since notifications may have been lost meanwhile. So
    the carried batches after an entry's last pointer or gap hold every event committed after
    their start whose notification has arrived; the rest will reach a feed registered now.

    Args:
        runs: The most runs remembered.
        size: The most payload characters remembered per run (oldest dropped first).
    """

    def __init__(self, runs: int = 256, size: int = 32_768) -> None:
        self._runs = runs
        self._size = size
        self._entries: OrderedDict[str, tuple[deque[str], int]] = OrderedDict()

    def add(self, run_id: str, payload: str) -> None:
        """Remember a payload of the run's (called for each, in arrival order)."""
        payloads, size = self._entries.pop(run_id, (deque[str](), 0))
        payloads.append(payload)
        size += len(payload)
        while size > self._size and len(payloads) > 1:
            size -= len(payloads.popleft())
        self._entries[run_id] = (payloads, size)
        if len(self._entries) > self._runs:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (the listener reconnected: notifications may have been lost)."""
        self._entries.clear()

    def after(self, run_id: str, cursor: int) -> list[tuple[int, str, str]] | None:
        """Return the run's events after `cursor` if the remembered batches hold all of them.

        None when they may not: nothing remembered, a pointer or a gap after `cursor`, or
        remembered batches that start after `cursor + 1`, or none after `cursor`.
        """
        entry = self._entries.get(run_id)
        events: list[tuple[int, str, str]] = []
        for payload in entry[0] if entry else ():
            batch = carried(payload)
            if batch is None or (events and batch.first != events[-1][0] + 1):
                events = []  # the log holds what came before: only what follows counts
            if batch is not None:
                events.extend(batch.events)
        if not events or events[0][0] > cursor + 1 or events[-1][0] <= cursor:
            return None
        return [e for e in events if e[0] > cursor]
