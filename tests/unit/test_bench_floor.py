"""The guarantee floor: its verdicts follow its figures; its events carry what clients need."""

from __future__ import annotations

from langchain_core.messages import AIMessageChunk

from bench.floor_log import encode
from bench.floor_report import RUNGS, Series, tables, verdicts
from bench.overhead import Sample

# Per rung: latency (s), runs/s, Python CPU per run (s), Postgres CPU per run (s).
FIGURES = {
    "L0": (0.040, 20.0, 0.040, 0.008),
    "L1": (0.046, 18.0, 0.045, 0.012),
    "L2": (0.050, 17.0, 0.046, 0.013),
    "L3": (0.056, 16.0, 0.047, 0.015),
    "L4": (0.100, 10.0, 0.090, 0.035),
}


def series(latency_l2: list[float], latency_l3: list[float] | None = None) -> Series:
    s = Series()
    l3s = latency_l3 or [FIGURES["L3"][0]] * len(latency_l2)
    for repeat, (l2, l3) in enumerate(zip(latency_l2, l3s, strict=True)):
        for rung in RUNGS:
            latency, rate, cpu, pg = FIGURES[rung]
            latency = {"L2": l2, "L3": l3}.get(rung, latency)
            for c in (1, 8):
                s.samples[rung][c].append(Sample([latency] * 5, rate, cpu, pg + repeat * 1e-6))
    return s


def test_floors_within_every_target_leave_the_misses_to_agentrt() -> None:
    lines = verdicts(series([0.050, 0.050, 0.050]))
    assert len(lines) == 4
    assert all("can meet the target" in line for line in lines)
    assert "(met by L2 in 3 of 3 repeats, by L3 in 3)" in lines[0]
    assert "L2 1.25x and L3 1.40x L0" in lines[0]
    assert "agentrt (L4): 2.50x" in lines[0]
    assert "the floor (L3) is 27% of agentrt's distance from L0" in lines[0]


def test_a_stream_floor_beyond_a_target_names_the_stream_guarantee() -> None:
    latency = verdicts(series([0.080, 0.080, 0.080], [0.090] * 3))[0]
    assert "L2 2.00x" in latency
    assert "the floor itself misses the target" in latency
    assert "commits every event before it delivers it" in latency


def test_a_crash_safe_floor_beyond_a_target_names_the_guarantees_it_adds() -> None:
    latency = verdicts(series([0.050] * 3, [0.070] * 3))[0]
    assert "L3 1.75x L0" in latency
    assert "L3 misses the target in every repeat (met by L2 in 3 of 3 repeats, by L3 in 0)" in (
        latency
    )
    assert "outlive the processes that accept and run it" in latency
    assert "runs each tool call once" in latency


def test_repeats_of_the_crash_safe_floor_on_both_sides_of_a_target_call_no_side() -> None:
    latency = verdicts(series([0.050, 0.050, 0.070], [0.056, 0.056, 0.070]))[0]
    assert "L3's repeats fall on both sides of the target" in latency
    assert "(met by L2 in 2 of 3 repeats, by L3 in 2): too close to call" in latency
    assert "L2 1.25x to 1.75x, L3 1.40x to 1.75x" in latency


def test_l2_on_both_sides_and_l3_beyond_in_every_repeat_names_l3s_guarantees() -> None:
    latency = verdicts(series([0.050, 0.050, 0.070], [0.070] * 3))[0]
    assert "L3 misses the target in every repeat (met by L2 in 2 of 3 repeats, by L3 in 0)" in (
        latency
    )


def test_tables_show_each_rung_against_l0_and_the_rung_before() -> None:
    text = "\n".join(tables(series([0.050] * 3)))
    assert "| L2 + HTTP/SSE server (n=15) | 50.0 ms | 50.0 ms | 1.25x | +4.0 ms (1.09x) |" in text
    assert "| L3 + queue, leases, fencing, tool ledger | 16.0 | 0.80x | -1.0 (0.94x) |" in text
    assert "| L4 agentrt | 10.0 | 0.50x | -6.0 (0.62x) |" in text


def test_a_streamed_chunk_is_logged_as_its_text_only() -> None:
    chunk = AIMessageChunk(content="word ", id="run-1", response_metadata={"model": "x" * 500})
    assert encode(("messages", (chunk, {"langgraph_node": "call_model"}))) == (
        '{"type": "delta", "text": "word "}'
    )
    assert encode(("updates", {"call_model": {}})) == '{"type": "step", "nodes": ["call_model"]}'


def with_first_events(l2: float, l3: float, l4: float) -> Series:
    s = series([0.050] * 3)
    s.firsts = {"L2": [l2] * 5, "L3": [l3] * 5, "L4": [l4] * 5}
    s.round_trip = 0.0025
    return s


def test_a_first_event_within_the_target_at_the_floors_leaves_the_miss_to_agentrt() -> None:
    s = with_first_events(0.004, 0.0045, 0.012)
    first = verdicts(s)[-1]
    assert first.startswith("- First event p50 (target ≤ 5 ms): the first event")
    assert "4.0 ms after the POST at L2 and 4.5 ms at L3 (an HTTP round trip: 2.5 ms)" in first
    assert "can meet the target; what agentrt" in first and "agentrt (L4): 12.0 ms" in first
    assert "the floor (L3) is 21% of agentrt's distance from a round trip" in first
    assert "| L4 agentrt (n=5) | 12.0 ms | 12.0 ms | 4.8x of 2.5 ms |" in "\n".join(tables(s))


def test_a_first_event_within_the_target_at_agentrt_too_is_said_to_meet_it() -> None:
    first = verdicts(with_first_events(0.0015, 0.0016, 0.004))[-1]
    assert "agentrt (L4): 4.0 ms, which meets the target;" in first
    assert "what agentrt misses" not in first


def test_a_first_event_beyond_the_target_at_the_floor_names_the_guarantee() -> None:
    first = verdicts(with_first_events(0.007, 0.008, 0.012))[-1]
    assert "the floor itself misses the target" in first
    assert "commits every event before it delivers it" in first


def test_without_first_events_there_is_no_first_event_verdict() -> None:
    assert len(verdicts(series([0.050] * 3))) == 4


def test_agentrt_no_further_from_l0_than_the_floor_is_said_so() -> None:
    s = series([0.050] * 3)
    for rung, rate in (("L3", 16.0), ("L4", 17.0)):
        for sample in s.samples[rung][8]:
            sample.rate = rate
    assert "agentrt does no worse than the floor (L3)" in verdicts(s)[1]


def with_wal(l3_kib: int) -> Series:
    s = series([0.050] * 3)
    for rung, kib in (("L0", 30), ("L1", 40), ("L2", 40), ("L3", l3_kib), ("L4", 80)):
        for c in (1, 8):
            for sample in s.samples[rung][c]:
                sample.wal = kib * 1024
    return s


def test_wal_gets_a_table_and_a_verdict_when_it_was_measured() -> None:
    s = with_wal(50)
    lines = verdicts(s)
    assert len(lines) == 5
    wal = lines[4]
    assert wal.startswith("- WAL per run at concurrency 8 (target ≤ 1.5x L0): L1 writes 1.33x")
    assert "L3 1.67x L0's" in wal and "L3 misses the target in every repeat" in wal
    assert "| L4 agentrt | 80.0 KiB | 80.0 KiB | +50.0 KiB (2.67x) | +30.0 KiB (1.60x) |" in (
        "\n".join(tables(s))
    )


def test_a_ratio_at_its_limit_meets_the_target() -> None:
    wal = verdicts(with_wal(45))[4]
    assert "can meet the target (met by L2 in 3 of 3 repeats, by L3 in 3)" in wal


def test_first_tokens_get_a_table_and_a_verdict_against_l0s() -> None:
    s = series([0.050] * 3)
    s.tokens = {"L0": [0.020] * 5, "L1": [0.022] * 5, "L2": [0.026] * 5, "L3": [0.034] * 5}
    s.tokens["L4"] = [0.050] * 5
    token = verdicts(s)[-1]
    assert token.startswith("- First token p50 (target ≤ 1.5x L0's): L1's comes at 1.10x")
    assert "L3's 1.70x L0's (20.0 ms): L3 misses the target: no server" in token
    assert "agentrt (L4): 2.50x" in token
    assert "| L3 + queue, leases, fencing, tool ledger (n=5) | 34.0 ms | 34.0 ms | 1.70x |" in (
        "\n".join(tables(s))
    )
