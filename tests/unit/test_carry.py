"""The events channel's payloads: pointers, carried batches, and the runs' recent batches."""

from __future__ import annotations

from datetime import UTC, datetime

from server.events.carry import RecentBatches, carried, carried_head, last_seq, pointer, run_of

TS = datetime(2026, 12, 1, 18, 0, 0, 123456, tzinfo=UTC)


def batch(run_id: str, first: int, last: int) -> str:
    """A carrying payload of `note` events first..last, as the append's statement builds it."""
    lines = "\n".join(f'{seq} note {{"n": {seq}}}' for seq in range(first, last + 1))
    return carried_head(run_id, last, TS) + lines


def test_a_carried_payload_gives_the_wire_json_of_each_event() -> None:
    payload = carried_head("run_a", 4, TS) + '3 note {"a": "x\u2028y"}\n4 run.completed {}'
    found = carried(payload)
    assert found is not None
    assert (found.run_id, found.first, found.last) == ("run_a", 3, 4)
    assert found.events[0] == (
        3,
        "note",
        '{"seq":3,"type":"note","runId":"run_a","ts":"2026-12-01T18:00:00.123456Z",'
        '"data":{"a": "x\u2028y"}}',
    )
    assert (run_of(payload), last_seq(payload)) == ("run_a", 4)


def test_a_pointer_or_a_malformed_payload_carries_nothing() -> None:
    assert carried(pointer("run_a", 7)) is None
    assert (run_of(pointer("run_a", 7)), last_seq(pointer("run_a", 7))) == ("run_a", 7)
    assert carried(carried_head("run_a", 5, TS) + "3 note {}") is None  # last seq disagrees
    assert carried(carried_head("run_a", 4, TS) + "3 note {}\n5 note {}") is None  # a hole
    assert carried("run_a:x\nts\n1 note {}") is None
    # Digits `int` refuses, and a seq past bigint, are no seq: nothing, not an exception.
    for seq in ("\u00b2", "9" * 30):
        assert carried(f"run_a:{seq}\nts\n1 note {{}}") is None
        assert last_seq(f"run_a:{seq}") is None


def test_recent_batches_serve_a_stream_only_when_they_hold_everything_after_its_cursor() -> None:
    recent = RecentBatches()
    assert recent.after("run_a", 0) is None  # nothing heard yet: read the log
    recent.add("run_a", batch("run_a", 1, 1))
    recent.add("run_a", batch("run_a", 2, 3))
    recent.add("run_b", batch("run_b", 5, 5))
    assert [seq for seq, _, _ in recent.after("run_a", 0) or []] == [1, 2, 3]
    assert [seq for seq, _, _ in recent.after("run_a", 1) or []] == [2, 3]
    assert recent.after("run_a", 3) is None  # nothing after the cursor: read (the run may be over)
    assert recent.after("run_b", 0) is None  # starts after the cursor: read


def test_a_pointer_or_a_gap_leaves_only_the_batches_after_it() -> None:
    recent = RecentBatches()
    recent.add("run_a", batch("run_a", 1, 1))
    recent.add("run_a", pointer("run_a", 3))
    recent.add("run_a", batch("run_a", 4, 4))
    assert recent.after("run_a", 0) is None
    assert [seq for seq, _, _ in recent.after("run_a", 3) or []] == [4]
    recent.add("run_a", batch("run_a", 6, 6))  # 5 was never heard
    assert recent.after("run_a", 3) is None
    assert [seq for seq, _, _ in recent.after("run_a", 5) or []] == [6]


def test_recent_batches_are_bounded_and_forgotten_on_reconnection() -> None:
    recent = RecentBatches(runs=2, size=len(batch("run_a", 1, 1)) * 2)
    for seq in range(1, 4):
        recent.add("run_a", batch("run_a", seq, seq))
    assert recent.after("run_a", 0) is None  # the oldest batch was dropped
    assert [seq for seq, _, _ in recent.after("run_a", 1) or []] == [2, 3]
    recent.add("run_b", batch("run_b", 1, 1))
    recent.add("run_c", batch("run_c", 1, 1))  # run_a, the least recently notified, goes
    assert recent.after("run_a", 1) is None
    assert recent.after("run_c", 0) is not None
    recent.clear()
    assert recent.after("run_c", 0) is None
