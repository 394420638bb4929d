"""The guarantee floor's report: tables of the rungs, and one verdict per target."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.common import quantiles, trust
from bench.overhead import Sample

RUNGS = ("L0", "L1", "L2", "L3")
NAMES = {
    "L0": "L0 engine",
    "L1": "L1 + durable event log",
    "L2": "L2 + HTTP/SSE server",
    "L3": "L3 agentrt",
}
LEVELS = (1, 8)
GUARANTEE = (
    "commits every event before it delivers it (what makes a resumed stream gapless and "
    "exact) and serves it over HTTP"
)


@dataclass
class Series:
    """Samples per rung and concurrency, one per repeat."""

    samples: dict[str, dict[int, list[Sample]]] = field(
        default_factory=lambda: {r: {c: [] for c in LEVELS} for r in RUNGS}
    )
    logged: tuple[int, int] = (0, 0)  # L1 and L2 runs in the log, events per run
    idle: tuple[float, float] = (0.0, 0.0)  # CPU s/s of Postgres and of agentrt, all idle
    commits: dict[int, float] = field(default_factory=dict)  # per L1 run, by concurrency
    loads: list[float] = field(default_factory=list)  # 1-minute load average at each batch
    # Seconds from the POST to the first SSE event, one run at a time (L2 and L3).
    firsts: dict[str, list[float]] = field(default_factory=dict)
    round_trip: float = 0.0  # an HTTP round trip to the floor server (`GET /readyz`), median

    def median(self, rung: str, c: int, pick: str) -> float:
        """The median over the repeats of one quantity (`rate`, `cpu`, `pg_cpu`)."""
        return float(statistics.median(getattr(s, pick) for s in self.samples[rung][c]))

    def latencies(self, rung: str) -> list[float]:
        """Every latency at concurrency 1, pooled over the repeats."""
        return [x for s in self.samples[rung][1] for x in s.latencies]

    def per_repeat(self, rung: str, base: str, c: int, pick: str) -> tuple[list[float], ...]:
        """`rung` against `base` within each repeat: the differences and the ratios.

        `pick` is a Sample field, or `p50` for the median latency. Pairs taken back to back in
        one repeat share the machine's state at that moment, so their ratio is steadier than
        a ratio of medians taken over the whole run.
        """

        def value(x: Sample) -> float:
            return statistics.median(x.latencies) if pick == "p50" else float(getattr(x, pick))

        pairs = list(zip(self.samples[rung][c], self.samples[base][c], strict=True))
        return [value(x) - value(y) for x, y in pairs], [value(x) / value(y) for x, y in pairs]

    def paired(self, rung: str, base: str, c: int, pick: str) -> tuple[float, float]:
        """The medians of `per_repeat`: difference and ratio."""
        diffs, ratios = self.per_repeat(rung, base, c, pick)
        return float(statistics.median(diffs)), float(statistics.median(ratios))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _against(s: Series, rung: str, base: str, c: int, pick: str) -> str:
    """`+X ms (Yx)` (runs/s: `+X (Yx)`) of `rung` against `base`, paired by repeat."""
    diff, ratio = s.paired(rung, base, c, pick)
    shown = f"{diff:+.1f}" if pick == "rate" else f"{diff * 1000:+.1f} ms"
    return f"{shown} ({ratio:.2f}x)"


def _share(l0: float, l2: float, l3: float, base: str = "L0") -> str:
    """How much of agentrt's distance from `base` (figure `l0`) the floor (L2) accounts for."""
    if l3 == l0:
        return f"agentrt is at {base}"
    return f"the floor is {(l2 - l0) / (l3 - l0):.0%} of agentrt's distance from {base}"


def verdicts(s: Series) -> list[str]:
    """One sentence per target: does the floor (L2) itself already miss it?

    Figures are rounded as shown before they are held against the target; when L2's repeats
    fall on both sides of the target, the sentence says so rather than pick a side.
    """
    lat = {r: quantiles(s.latencies(r))["p50"] for r in RUNGS}
    rate = {r: round(s.paired(r, "L0", 8, "rate")[1], 2) for r in RUNGS}
    cpu = {r: round(s.paired(r, "L0", 8, "cpu")[0] * 1000, 1) for r in RUNGS}
    pg = {r: round(s.paired(r, "L0", 8, "pg_cpu")[1], 2) for r in RUNGS}
    out = []

    def verdict(
        name: str, floor: str, ok: bool, repeats: list[bool], ours: str, share: str
    ) -> None:
        if len(repeats) > 1 and len(set(repeats)) > 1:
            outcome = (
                "L2's repeats fall on both sides of the target: too close to call on this machine"
            )
        elif ok:
            outcome = (
                "a durable HTTP server can meet the target in principle; what agentrt misses "
                "beyond the floor is its own implementation's"
            )
        else:
            outcome = (
                f"the floor itself misses the target: no server that {GUARANTEE} meets it on "
                "this machine"
            )
        out.append(f"- {name}: {floor}: {outcome}. agentrt (L3): {ours}; {share}.")

    def spread(values: list[float], unit: str, digits: int = 2) -> str:
        if len(values) < 2:
            return ""
        low, high = f"{min(values):.{digits}f}{unit}", f"{max(values):.{digits}f}{unit}"
        return f" (L2 per repeat: {low} to {high})"

    r1, r2, r3 = (round(lat[r] / lat["L0"], 2) for r in ("L1", "L2", "L3"))
    ratios = s.per_repeat("L2", "L0", 1, "p50")[1]
    verdict(
        "Latency p50 at concurrency 1 (target ≤ 1.5x L0)",
        f"L1 is {r1:.2f}x and L2 {r2:.2f}x L0{spread(ratios, 'x')}",
        r2 <= 1.5,
        [round(x, 2) <= 1.5 for x in ratios],
        f"{r3:.2f}x",
        _share(lat["L0"], lat["L2"], lat["L3"]),
    )
    ratios = s.per_repeat("L2", "L0", 8, "rate")[1]
    verdict(
        "Runs/s at concurrency 8 (target ≥ 0.7x L0)",
        f"L1 reaches {rate['L1']:.2f}x and L2 {rate['L2']:.2f}x L0{spread(ratios, 'x')}",
        rate["L2"] >= 0.7,
        [round(x, 2) >= 0.7 for x in ratios],
        f"{rate['L3']:.2f}x",
        _share(1, rate["L2"], rate["L3"]),
    )
    diffs = [x * 1000 for x in s.per_repeat("L2", "L0", 8, "cpu")[0]]
    verdict(
        "Python CPU per run at concurrency 8 (target ≤ L0 + 8 ms)",
        f"L1 is L0 {cpu['L1']:+.1f} ms and L2 L0 {cpu['L2']:+.1f} ms{spread(diffs, ' ms', 1)}",
        cpu["L2"] <= 8,
        [round(x, 1) <= 8 for x in diffs],
        f"L0 {cpu['L3']:+.1f} ms",
        _share(0, cpu["L2"], cpu["L3"]),
    )
    ratios = s.per_repeat("L2", "L0", 8, "pg_cpu")[1]
    verdict(
        "Postgres CPU per run at concurrency 8 (target ≤ 2x L0)",
        f"L1 is {pg['L1']:.2f}x and L2 {pg['L2']:.2f}x L0{spread(ratios, 'x')}",
        pg["L2"] <= 2,
        [round(x, 2) <= 2 for x in ratios],
        f"{pg['L3']:.2f}x",
        _share(1, pg["L2"], pg["L3"]),
    )
    if s.firsts.get("L2") and s.firsts.get("L3"):
        l2, l3 = (round(quantiles(s.firsts[r])["p50"] * 1000, 1) for r in ("L2", "L3"))
        verdict(
            "First event p50 (target ≤ 5 ms)",
            f"L2's first event, its `run.created` committed before it is sent, comes "
            f"{l2:.1f} ms after the POST (an HTTP round trip: {s.round_trip * 1000:.1f} ms)",
            l2 <= 5,
            [],
            f"{l3:.1f} ms",
            _share(s.round_trip * 1000, l2, l3, base="a round trip"),
        )
    return out


def tables(s: Series) -> list[str]:
    """The latency, throughput and CPU tables, each rung against L0 and the rung before."""
    lines = [
        "| concurrency 1 | latency p50 | p95 | p50 against L0 | step from the rung before |",
        "|---|---|---|---|---|",
    ]
    p50 = {r: quantiles(s.latencies(r))["p50"] for r in RUNGS}
    for before, r in zip((None, *RUNGS), RUNGS, strict=False):
        q = quantiles(s.latencies(r))
        step = ""
        if before:
            step = f"{(q['p50'] - p50[before]) * 1000:+.1f} ms ({q['p50'] / p50[before]:.2f}x)"
        lines.append(
            f"| {NAMES[r]} (n={len(s.latencies(r))}) | {_ms(q['p50'])} | {_ms(q['p95'])} | "
            f"{q['p50'] / p50['L0']:.2f}x | {step} |"
        )
    if s.firsts:
        lines += [
            "",
            "| concurrency 1 | first event p50 | p95 | against an HTTP round trip |",
            "|---|---|---|---|",
        ]
        for r in ("L2", "L3"):
            if s.firsts.get(r):
                q = quantiles(s.firsts[r])
                lines.append(
                    f"| {NAMES[r]} (n={len(s.firsts[r])}) | {_ms(q['p50'])} | {_ms(q['p95'])} "
                    f"| {q['p50'] / s.round_trip:.1f}x of {_ms(s.round_trip)} |"
                    if s.round_trip
                    else f"| {NAMES[r]} (n={len(s.firsts[r])}) | {_ms(q['p50'])} | "
                    f"{_ms(q['p95'])} | |"
                )
    lines += [
        "",
        "| concurrency 8 | runs/s | against L0 | step from the rung before | repeats |",
        "|---|---|---|---|---|",
    ]
    for before, r in zip((None, *RUNGS), RUNGS, strict=False):
        step = _against(s, r, before, 8, "rate") if before else ""
        lines.append(
            f"| {NAMES[r]} | {s.median(r, 8, 'rate'):.1f} | {s.paired(r, 'L0', 8, 'rate')[1]:.2f}x"
            f" | {step} | {trust([x.rate for x in s.samples[r][8]])} |"
        )
    lines += [
        "",
        "| CPU per run | Python, c=1 | Python, c=8 | c=8 against L0 | c=8 step | "
        "Postgres, c=1 | Postgres, c=8 | c=8 against L0 | c=8 step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for before, r in zip((None, *RUNGS), RUNGS, strict=False):
        cells = [NAMES[r]]
        for pick in ("cpu", "pg_cpu"):
            cells += [
                _ms(s.median(r, 1, pick)),
                _ms(s.median(r, 8, pick)),
                _against(s, r, "L0", 8, pick),
                _against(s, r, before, 8, pick) if before else "",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


RUNG_TEXT = (
    "What each rung keeps. L0 is the engine alone: the graph, the scripted model and "
    "LangGraph's `AsyncPostgresSaver` with a checkpoint committed at every step "
    '(`durability="sync"`, as agentrt\'s executor runs). L1 adds the one mechanism behind '
    "agentrt's stream guarantee: every stream part becomes a small event (a chunk's text, a "
    "step's node names, a custom event's dict) with a gapless `seq`, appended to "
    "`floor_events` with a NOTIFY and committed before it counts as delivered, by one writer "
    "task per run that batches whatever is pending while its previous commit is in flight "
    "(one statement per batch: the INSERT, of the batch sent as one JSON array, in a `WITH` "
    "whose `SELECT` is the `pg_notify`, which costs the client less than the two statements "
    "pipelined); the first event is the run's `run.created`, committed before the graph "
    "starts (a server that answers before the run it accepted is stored can lose it), and "
    "the run ends when its last event is committed. L2 serves L1 from a separate process "
    "(Starlette under uvicorn, as agentrt's API): the client POSTs `/runs` and reads the "
    "committed events as SSE frames, handed to the response in-process. L1 and L2 leave out "
    "agentrt's other guarantees and features: no queue and no separate worker process, no "
    "leases or fencing (a run survives no crash), no tool ledger, no traces, no cost ledger, "
    "no snapshot, no authentication, conversations or agent profiles. L3 is agentrt with all "
    "of them: one API process, one worker process (concurrency 32), one `?stream=true` "
    "request per run (its conversations are created before the timing starts)."
)
