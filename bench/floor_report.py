"""The guarantee floor's report: tables of the rungs, and one verdict per target."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.common import quantiles, trust
from bench.overhead import Sample

RUNGS = ("L0", "L1", "L2", "L3", "L4")
NAMES = {
    "L0": "L0 engine",
    "L1": "L1 + durable event log",
    "L2": "L2 + HTTP/SSE server",
    "L3": "L3 + queue, leases, fencing, tool ledger",
    "L4": "L4 agentrt",
}
LEVELS = (1, 8)
GUARANTEE = (
    "commits every event before it delivers it (what makes a resumed stream gapless and "
    "exact) and serves it over HTTP"
)
GUARANTEE_L3 = (
    "also lets a run outlive the processes that accept and run it (a queue and leases), "
    "fences out an attempt that lost its lease, and runs each tool call once (a ledger "
    "committed around it)"
)


@dataclass
class Series:
    """Samples per rung and concurrency, one per repeat."""

    samples: dict[str, dict[int, list[Sample]]] = field(
        default_factory=lambda: {r: {c: [] for c in LEVELS} for r in RUNGS}
    )
    # L1 and L2 runs in the log and events per run, then L3's.
    logged: tuple[int, int, int, int] = (0, 0, 0, 0)
    idle: tuple[float, float] = (0.0, 0.0)  # CPU s/s of Postgres and of agentrt, all idle
    commits: dict[int, float] = field(default_factory=dict)  # per L1 run, by concurrency
    loads: list[float] = field(default_factory=list)  # 1-minute load average at each batch
    # Seconds from the POST to the first SSE event, one run at a time (L2, L3 and L4).
    firsts: dict[str, list[float]] = field(default_factory=dict)
    round_trip: float = 0.0  # an HTTP round trip to the floor server (`GET /readyz`), median
    # Seconds from the start to the answer's first piece, one run at a time (every rung).
    tokens: dict[str, list[float]] = field(default_factory=dict)

    def median(self, rung: str, c: int, pick: str) -> float:
        """The median over the repeats of one quantity (`rate`, `cpu`, `pg_cpu`, `wal`)."""
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


def _share(l0: float, floor: float, ours: float, base: str = "L0") -> str:
    """How much of agentrt's distance from `base` (figure `l0`) the floor (L3) accounts for."""
    if ours == l0:
        return f"agentrt is at {base}"
    share = (floor - l0) / (ours - l0)
    if share >= 1:  # agentrt is no further from `base` than the floor, or on its better side
        return "agentrt does no worse than the floor (L3)"
    return f"the floor (L3) is {share:.0%} of agentrt's distance from {base}"


def _outcome(ok: dict[str, list[bool]], agentrt_met: bool = False) -> str:
    """Where the target is lost, from each floor's repeats (`ok[rung]`: met in each repeat).

    The crash-safe floor (L3) decides: it is what any server with all of agentrt's
    guarantees pays. The stream floor (L2) is named when even it misses in every repeat.
    """
    n, met2, met3 = len(ok["L3"]), sum(ok["L2"]), sum(ok["L3"])
    counts = f" (met by L2 in {met2} of {n} repeats, by L3 in {met3})" if n > 1 else ""
    if met2 == 0:
        return (
            f"the floor itself misses the target{counts}: no server that {GUARANTEE} meets it "
            "on this machine"
        )
    if met3 == 0:
        return (
            f"L3 misses the target{' in every repeat' if n > 1 else ''}{counts}: no server "
            f"that {GUARANTEE} and "
            f"{GUARANTEE_L3} meets it on this machine; those are the guarantees that cost it"
        )
    if met3 < n:
        return f"L3's repeats fall on both sides of the target{counts}: too close to call"
    if agentrt_met:
        return f"a server with agentrt's guarantees can meet the target{counts}"
    return (
        f"a server with agentrt's guarantees can meet the target{counts}; what agentrt misses "
        "beyond the floor (L3) is its own implementation's"
    )


def verdicts(s: Series) -> list[str]:
    """One sentence per target: do the floors (L2, then L3) themselves already miss it?

    Each floor is held against the target in every repeat (figures rounded as shown); when a
    floor's repeats fall on both sides of it, the sentence says so rather than pick a side.
    """
    floors = ("L2", "L3")
    out = []

    def spread(values: dict[str, list[float]], unit: str, digits: int = 2) -> str:
        parts = [
            f"{r} {min(v):.{digits}f}{unit} to {max(v):.{digits}f}{unit}"
            for r, v in values.items()
            if len(v) > 1
        ]
        return f" (per repeat: {', '.join(parts)})" if parts else ""

    def add(
        name: str, figures: str, ok: dict[str, list[bool]], ours: str, share: str, met: bool
    ) -> None:
        said = f"{ours}, which meets the target" if met else ours
        out.append(f"- {name}: {figures}: {_outcome(ok, met)}. agentrt (L4): {said}; {share}.")

    lat = {r: quantiles(s.latencies(r))["p50"] for r in RUNGS}
    shown = {r: round(lat[r] / lat["L0"], 2) for r in RUNGS}
    per = {r: s.per_repeat(r, "L0", 1, "p50")[1] for r in floors}
    add(
        "Latency p50 at concurrency 1 (target ≤ 1.5x L0)",
        f"L1 is {shown['L1']:.2f}x, L2 {shown['L2']:.2f}x and L3 {shown['L3']:.2f}x L0"
        + spread(per, "x"),
        {r: [round(x, 2) <= 1.5 for x in per[r]] for r in floors},
        f"{shown['L4']:.2f}x",
        _share(lat["L0"], lat["L3"], lat["L4"]),
        shown["L4"] <= 1.5,
    )

    def by_ratio(name: str, pick: str, verb: str, of: str, limit: float, least: bool) -> None:
        """A ratio to L0 at concurrency 8: at least `limit` if `least`, else at most."""
        ratio = {r: round(s.paired(r, "L0", 8, pick)[1], 2) for r in RUNGS}
        per = {r: s.per_repeat(r, "L0", 8, pick)[1] for r in floors}
        add(
            name,
            f"L1 {verb} {ratio['L1']:.2f}x, L2 {ratio['L2']:.2f}x and L3 {ratio['L3']:.2f}x {of}"
            + spread(per, "x"),
            {
                r: [round(x, 2) >= limit if least else round(x, 2) <= limit for x in per[r]]
                for r in floors
            },
            f"{ratio['L4']:.2f}x",
            _share(1, ratio["L3"], ratio["L4"]),
            ratio["L4"] >= limit if least else ratio["L4"] <= limit,
        )

    by_ratio("Runs/s at concurrency 8 (target ≥ 0.7x L0)", "rate", "reaches", "L0", 0.7, True)
    cpu = {r: round(s.paired(r, "L0", 8, "cpu")[0] * 1000, 1) for r in RUNGS}
    per = {r: [x * 1000 for x in s.per_repeat(r, "L0", 8, "cpu")[0]] for r in floors}
    add(
        "Python CPU per run at concurrency 8 (target ≤ L0 + 8 ms)",
        f"L1 is L0 {cpu['L1']:+.1f} ms, L2 L0 {cpu['L2']:+.1f} ms and L3 L0 {cpu['L3']:+.1f} ms"
        + spread(per, " ms", 1),
        {r: [round(x, 1) <= 8 for x in per[r]] for r in floors},
        f"L0 {cpu['L4']:+.1f} ms",
        _share(0, cpu["L3"], cpu["L4"]),
        cpu["L4"] <= 8,
    )
    by_ratio(
        "Postgres CPU per run at concurrency 8 (target ≤ 2x L0)", "pg_cpu", "is", "L0", 2, False
    )
    if all(x.wal > 0 for x in s.samples["L0"][8]):
        by_ratio(
            "WAL per run at concurrency 8 (target ≤ 1.5x L0)", "wal", "writes", "L0's", 1.5, False
        )
    if all(s.firsts.get(r) for r in ("L2", "L3", "L4")):
        first = {r: round(quantiles(s.firsts[r])["p50"] * 1000, 1) for r in ("L2", "L3", "L4")}
        add(
            "First event p50 (target ≤ 5 ms)",
            f"the first event, the run's `run.created` committed before it is sent, comes "
            f"{first['L2']:.1f} ms after the POST at L2 and {first['L3']:.1f} ms at L3 (an HTTP "
            f"round trip: {s.round_trip * 1000:.1f} ms)",
            {r: [first[r] <= 5] for r in floors},
            f"{first['L4']:.1f} ms",
            _share(s.round_trip * 1000, first["L3"], first["L4"], base="a round trip"),
            first["L4"] <= 5,
        )
    if all(s.tokens.get(r) for r in RUNGS):
        token = {r: quantiles(s.tokens[r])["p50"] for r in RUNGS}
        ratio = {r: round(token[r] / token["L0"], 2) for r in RUNGS}
        add(
            "First token p50 (target ≤ 1.5x L0's)",
            f"L1's comes at {ratio['L1']:.2f}x, L2's {ratio['L2']:.2f}x and L3's "
            f"{ratio['L3']:.2f}x L0's ({token['L0'] * 1000:.1f} ms)",
            {r: [ratio[r] <= 1.5] for r in floors},
            f"{ratio['L4']:.2f}x",
            _share(token["L0"], token["L3"], token["L4"]),
            ratio["L4"] <= 1.5,
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
        for r in ("L2", "L3", "L4"):
            if s.firsts.get(r):
                q = quantiles(s.firsts[r])
                lines.append(
                    f"| {NAMES[r]} (n={len(s.firsts[r])}) | {_ms(q['p50'])} | {_ms(q['p95'])} "
                    f"| {q['p50'] / s.round_trip:.1f}x of {_ms(s.round_trip)} |"
                    if s.round_trip
                    else f"| {NAMES[r]} (n={len(s.firsts[r])}) | {_ms(q['p50'])} | "
                    f"{_ms(q['p95'])} | |"
                )
    if all(s.tokens.get(r) for r in RUNGS):
        lines += [
            "",
            "| concurrency 1 | first token p50 | p95 | against L0 |",
            "|---|---|---|---|",
        ]
        token0 = quantiles(s.tokens["L0"])["p50"]
        for r in RUNGS:
            q = quantiles(s.tokens[r])
            lines.append(
                f"| {NAMES[r]} (n={len(s.tokens[r])}) | {_ms(q['p50'])} | {_ms(q['p95'])} "
                f"| {q['p50'] / token0:.2f}x |"
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
    if all(x.wal > 0 for x in s.samples["L0"][8]):
        lines += [
            "",
            "| WAL per run | c=1 | c=8 | c=8 against L0 | c=8 step |",
            "|---|---|---|---|---|",
        ]
        for before, r in zip((None, *RUNGS), RUNGS, strict=False):
            kib = {c: s.median(r, c, "wal") / 1024 for c in LEVELS}
            diff, ratio = s.paired(r, "L0", 8, "wal")
            step = ""
            if before:
                step_diff, step_ratio = s.paired(r, before, 8, "wal")
                step = f"{step_diff / 1024:+.1f} KiB ({step_ratio:.2f}x)"
            lines.append(
                f"| {NAMES[r]} | {kib[1]:.1f} KiB | {kib[8]:.1f} KiB "
                f"| {diff / 1024:+.1f} KiB ({ratio:.2f}x) | {step} |"
            )
    return lines


RUNG_TEXT = (
    "What each rung keeps. L0 is the engine alone: the graph, the scripted model and "
    "LangGraph's `AsyncPostgresSaver` with a checkpoint committed at every step "
    '(`durability="sync"`, as agentrt\'s executor runs), as LangGraph ships it. From L1 on, '
    "checkpoints are stored by agentrt's `InlinePostgresSaver` (the same rows, serialised on "
    "the event loop instead of in a thread), as agentrt stores them. L1 adds the one mechanism "
    "behind agentrt's stream guarantee: every stream part becomes a small event (a chunk's "
    "text, a step's node names, a custom event's dict) with a gapless `seq`, appended to "
    "`floor_events` with a NOTIFY and committed before it counts as delivered, by one writer "
    "task per run that batches whatever is pending while its previous commit is in flight (one "
    "statement per batch: the INSERT, of the batch sent as one JSON array, in a `WITH` whose "
    "`SELECT` is the `pg_notify`, which costs the client less than the two statements "
    "pipelined); the first event is the run's `run.created`, committed before the graph starts "
    "(a server that answers before the run it accepted is stored can lose it), and the run "
    "ends when its last event is committed. L2 serves L1 from a separate process (Starlette "
    "under uvicorn, as agentrt's API): the client POSTs `/runs` and reads the committed events "
    "as SSE frames, handed to the response in-process. L1 and L2 leave out agentrt's other "
    "guarantees and features: no queue and no separate worker process, no leases or fencing (a "
    "run survives no crash), no tool ledger, no traces, no cost ledger, no snapshot, no "
    "authentication, conversations or agent profiles. L3 adds the mechanisms of agentrt's "
    "other guarantees, each at its least (bench/floor_worker.py): the server only stores the "
    "run, queued, with its `run.created` and a NOTIFY, in one statement, and streams what a "
    "separate worker process commits, as the NOTIFY payloads bring it (a run outlives the "
    "process that accepted it); the worker claims the oldest queued run in one statement (`FOR "
    "UPDATE SKIP LOCKED`, its lease taken and its generation bumped) with `run.started` in the "
    "same transaction, renews its leases every second (a run outlives the process that runs "
    "it), runs every checkpoint and event write of the attempt in one transaction with a fence "
    "(a shared advisory lock and a check of the generation: an attempt that lost its lease "
    "writes nothing that wins; a step's task writes wait for the step's checkpoint and go in "
    "its transaction, and the checkpoints of the steps a later attempt runs again at no cost "
    "(the first step, building the context, the tools' step) in the next write's, checkpoint "
    "or event batch, as agentrt's do), and records each tool call so that it runs once: on a "
    "first attempt, a call of a tool that is safe to run again (the calculator) with its "
    "result in the next event batch's transaction, as agentrt's are; otherwise committed "
    "before the tool runs and its result after. Still left out at L3: traces, the cost "
    "ledger, the snapshot, authentication, conversations, agent profiles, limits. The "
    "floors' writers "
    "commit their batches in transactions of their own; agentrt carries a step's reports in "
    "the transaction of its next checkpoint write instead, so on Postgres CPU the floors are "
    "what a plain design pays, not the least possible. L4 is agentrt with all of them: one API "
    "process, one worker process (concurrency 32), one `?stream=true` request per run (its "
    "conversations are created before the timing starts)."
)
