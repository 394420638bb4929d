"""The guarantee floor: what durable streaming costs at minimum, rung by rung, against agentrt.

Four rungs run the same graph and scripted model as bench/engine.py (one calculator call, then
20 streamed chunks), all with `durability="sync"`, back to back and interleaved in every
repeat, on the same Postgres:

- L0, the engine: `Engine.run()` in this process.
- L1, + a gapless event log: every stream part committed to Postgres before it counts as
  delivered (bench/floor_log.py), in this process.
- L2, + served over HTTP: L1 inside a minimal server process (bench/floor_server.py); the
  client POSTs `/runs` and reads committed events as SSE to the terminal event.
- L3, agentrt: API and worker processes, one `?stream=true` request per run.

L2 is the least any server with agentrt's stream guarantee pays; L3 minus L2 is agentrt's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.client import Endpoint, sse
from bench.common import (
    ROOT,
    Figures,
    Proc,
    env_for,
    free_port,
    postgres_cpu_seconds,
    processes,
    quantiles,
    run_async,
    start_stack,
    trust,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT, Engine, engine
from bench.floor_log import Pool, durable_run, event_pool
from bench.overhead import Sample, agentrt_run, conversations

RUNGS = ("L0", "L1", "L2", "L3")
NAMES = {
    "L0": "L0 engine",
    "L1": "L1 + durable event log",
    "L2": "L2 + HTTP/SSE server",
    "L3": "L3 agentrt",
}
LEVELS = (1, 8)
GUARANTEE = (
    "every event committed before it is delivered (a resumed stream is gapless and exact), "
    "served over HTTP"
)


@dataclass
class Series:
    """Samples per rung and concurrency, one per repeat."""

    samples: dict[str, dict[int, list[Sample]]] = field(
        default_factory=lambda: {r: {c: [] for c in LEVELS} for r in RUNGS}
    )

    def median(self, rung: str, c: int, pick: str) -> float:
        """The median over the repeats of one quantity (`rate`, `cpu`, `pg_cpu`)."""
        return float(statistics.median(getattr(s, pick) for s in self.samples[rung][c]))

    def latencies(self, rung: str) -> list[float]:
        """Every latency at concurrency 1, pooled over the repeats."""
        return [x for s in self.samples[rung][1] for x in s.latencies]


async def batch(
    one: Callable[[], Awaitable[float]],
    runs: int,
    concurrency: int,
    cpu: Callable[[], float],
    database_url: str,
) -> Sample:
    """Run `one` `runs` times, `concurrency` at a time; note latencies, runs/s and CPU per run."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def timed() -> None:
        async with gate:
            latencies.append(await one())

    cpu0, pg0 = cpu(), postgres_cpu_seconds(database_url)
    started = time.perf_counter()
    async with asyncio.timeout(600):
        await asyncio.gather(*(timed() for _ in range(runs)))
    rate = runs / (time.perf_counter() - started)
    pg = (postgres_cpu_seconds(database_url) - pg0) / runs
    return Sample(latencies, rate, (cpu() - cpu0) / runs, pg)


def start_floor_server(database_url: str, limit_s: float = 60) -> Proc:
    """Start bench/floor_server.py on a free port; wait until it answers /readyz."""
    port = free_port()
    fd, log = tempfile.mkstemp(prefix="agentrt-bench-floor-", suffix=".log")
    args = [sys.executable, "-m", "bench.floor_server", "--port", str(port)]
    with os.fdopen(fd, "wb") as out:
        popen = subprocess.Popen(
            [*args, "--database-url", database_url],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc = Proc(popen, f"http://127.0.0.1:{port}", Path(log))
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{proc.url}/readyz", timeout=1).status_code == 200:
                return proc
        if popen.poll() is not None:
            raise RuntimeError(f"the floor server exited at start:\n{proc.tail()}")
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"the floor server did not become ready:\n{proc.tail()}")


@dataclass
class Rungs:
    """What each rung needs: the in-process engine and pool, the two servers."""

    eng: Engine
    pool: Pool
    floor_ep: Endpoint
    floor_proc: Proc
    agentrt_ep: Endpoint
    agentrt_procs: list[Proc]
    database_url: str

    async def l0(self) -> float:
        """One engine run; its seconds."""
        return (await self.eng.run())[2]

    async def l1(self) -> float:
        """One run with its events committed, in this process; its seconds."""
        started = time.perf_counter()
        await durable_run(self.eng, self.pool)
        return time.perf_counter() - started

    async def l2(self) -> float:
        """One run POSTed to the floor server and read to its terminal event; its seconds."""
        started = time.perf_counter()
        times = await sse(self.floor_ep, "/runs", method="POST", payload={"input": "go"})
        if times.terminal != "run.completed":
            raise RuntimeError(f"a floor-server run ended {times.terminal or 'without an end'}")
        return float(times.end - started)

    async def sample(self, rung: str, runs: int, concurrency: int) -> Sample:
        """One batch of `rung`; agentrt's conversations are made before the timing starts."""
        url = self.database_url
        if rung == "L0":
            return await batch(self.l0, runs, concurrency, time.process_time, url)
        if rung == "L1":
            return await batch(self.l1, runs, concurrency, time.process_time, url)
        if rung == "L2":
            return await batch(self.l2, runs, concurrency, self.floor_proc.cpu_seconds, url)
        convs = iter(await conversations(self.agentrt_ep, runs))
        procs = self.agentrt_procs
        return await batch(
            lambda: agentrt_run(self.agentrt_ep, next(convs)),
            runs,
            concurrency,
            lambda: sum(p.cpu_seconds() for p in procs),
            url,
        )


async def measure(
    database_url: str, procs: list[Proc], floor_proc: Proc, runs: dict[int, int], repeats: int
) -> Series:
    """Run the four rungs back to back at each concurrency, `repeats` times."""
    series = Series()
    assert procs[0].url is not None and floor_proc.url is not None
    async with engine(database_url) as eng, event_pool(database_url) as pool:
        eng.durability = "sync"
        rungs = Rungs(
            eng,
            pool,
            Endpoint.of(floor_proc.url),
            floor_proc,
            Endpoint.of(procs[0].url),
            procs,
            database_url,
        )
        for rung in RUNGS:  # warm up every path: imports, pools, caches
            await rungs.sample(rung, 10, 2)
        for _ in range(repeats):
            for c in LEVELS:
                for rung in RUNGS:
                    series.samples[rung][c].append(await rungs.sample(rung, runs[c], c))
    return series


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _step(value: float, before: float, unit_ms: bool = True) -> str:
    """What a rung adds to the one before: a difference and a ratio."""
    diff = f"{(value - before) * 1000:+.1f} ms" if unit_ms else f"{value - before:+.1f}"
    return f"{diff} ({value / before:.2f}x)"


def _share(l0: float, l2: float, l3: float) -> str:
    """How much of agentrt's distance from L0 the floor (L2) accounts for."""
    if l3 == l0:
        return "agentrt is at L0"
    return f"the floor is {(l2 - l0) / (l3 - l0):.0%} of agentrt's distance from L0"


def verdicts(s: Series) -> list[str]:
    """One sentence per target: does the floor (L2) itself already miss it?"""
    lat = {r: quantiles(s.latencies(r))["p50"] for r in RUNGS}
    rate = {r: s.median(r, 8, "rate") for r in RUNGS}
    cpu = {r: s.median(r, 8, "cpu") for r in RUNGS}
    pg = {r: s.median(r, 8, "pg_cpu") for r in RUNGS}
    out = []

    def verdict(name: str, floor: str, ok: bool, ours: str, share: str) -> None:
        outcome = (
            "a durable HTTP server can meet the target in principle, so a miss by agentrt is "
            "its own implementation's"
            if ok
            else "the floor itself misses the target: no server that keeps this guarantee ("
            f"{GUARANTEE}) meets it here"
        )
        out.append(f"- {name}: {floor}: {outcome}. agentrt (L3): {ours}; {share}.")

    r2, r3 = lat["L2"] / lat["L0"], lat["L3"] / lat["L0"]
    verdict(
        "Latency p50 at concurrency 1 (target ≤ 1.5x L0)",
        f"L2 is {r2:.2f}x L0",
        r2 <= 1.5,
        f"{r3:.2f}x",
        _share(lat["L0"], lat["L2"], lat["L3"]),
    )
    r2, r3 = rate["L2"] / rate["L0"], rate["L3"] / rate["L0"]
    verdict(
        "Runs/s at concurrency 8 (target ≥ 0.7x L0)",
        f"L2 reaches {r2:.2f}x L0",
        r2 >= 0.7,
        f"{r3:.2f}x",
        _share(rate["L0"], rate["L2"], rate["L3"]),
    )
    e2, e3 = (cpu["L2"] - cpu["L0"]) * 1000, (cpu["L3"] - cpu["L0"]) * 1000
    verdict(
        "Python CPU per run at concurrency 8 (target ≤ L0 + 8 ms)",
        f"L2 is L0 {e2:+.1f} ms",
        e2 <= 8,
        f"L0 {e3:+.1f} ms",
        _share(cpu["L0"], cpu["L2"], cpu["L3"]),
    )
    r2, r3 = pg["L2"] / pg["L0"], pg["L3"] / pg["L0"]
    verdict(
        "Postgres CPU per run at concurrency 8 (target ≤ 2x L0)",
        f"L2 is {r2:.2f}x L0",
        r2 <= 2,
        f"{r3:.2f}x",
        _share(pg["L0"], pg["L2"], pg["L3"]),
    )
    return out


def tables(s: Series) -> list[str]:
    """The latency, throughput and CPU tables, each rung against L0 and the rung before."""
    lines = [
        "| concurrency 1 | latency p50 | p95 | p50 against L0 | step from the rung before |",
        "|---|---|---|---|---|",
    ]
    before = None
    p50 = {r: quantiles(s.latencies(r))["p50"] for r in RUNGS}
    for r in RUNGS:
        q = quantiles(s.latencies(r))
        step = _step(q["p50"], p50[before]) if before else ""
        lines.append(
            f"| {NAMES[r]} (n={len(s.latencies(r))}) | {_ms(q['p50'])} | {_ms(q['p95'])} | "
            f"{q['p50'] / p50['L0']:.2f}x | {step} |"
        )
        before = r
    lines += [
        "",
        "| concurrency 8 | runs/s | against L0 | step from the rung before | repeats |",
        "|---|---|---|---|---|",
    ]
    before = None
    for r in RUNGS:
        rate = s.median(r, 8, "rate")
        ratios = [x.rate / f.rate for f, x in zip(s.samples["L0"][8], s.samples[r][8], strict=True)]
        step = _step(rate, s.median(before, 8, "rate"), unit_ms=False) if before else ""
        lines.append(
            f"| {NAMES[r]} | {rate:.1f} | {statistics.median(ratios):.2f}x | {step} | "
            f"{trust([x.rate for x in s.samples[r][8]])} |"
        )
        before = r
    lines += [
        "",
        "| CPU per run | Python, c=1 | Python, c=8 | c=8 against L0 | c=8 step | "
        "Postgres, c=1 | Postgres, c=8 | c=8 against L0 | c=8 step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    before = None
    for r in RUNGS:
        cells = [NAMES[r]]
        for pick in ("cpu", "pg_cpu"):
            value, base = s.median(r, 8, pick), s.median("L0", 8, pick)
            cells += [
                _ms(s.median(r, 1, pick)),
                _ms(value),
                f"{(value - base) * 1000:+.1f} ms ({value / base:.2f}x)",
                _step(value, s.median(before, 8, pick)) if before else "",
            ]
        lines.append("| " + " | ".join(cells) + " |")
        before = r
    return lines


RUNG_TEXT = (
    "What each rung keeps. L0 is the engine alone: the graph, the scripted model and "
    "LangGraph's `AsyncPostgresSaver` with a checkpoint committed at every step "
    '(`durability="sync"`, as agentrt\'s executor runs). L1 adds the one mechanism behind '
    "agentrt's stream guarantee: every stream part becomes a small event (a chunk's text, a "
    "step's node names, a custom event's dict) with a gapless `seq`, appended to "
    "`floor_events` with a NOTIFY and committed before it counts as delivered, by one writer "
    "task per run that batches whatever is pending while its previous commit is in flight; "
    "the run ends when its last event is committed. L2 serves L1 from a separate process "
    "(Starlette under uvicorn, as agentrt's API): the client POSTs `/runs` and reads the "
    "committed events as SSE frames, handed to the response in-process. L1 and L2 leave out "
    "agentrt's other guarantees and features: no queue and no separate worker process, no "
    "leases or fencing (a run survives no crash), no tool ledger, no traces, no cost ledger, "
    "no snapshot, no authentication, conversations or agent profiles. L3 is agentrt with all "
    "of them: one API process, one worker process (concurrency 32), one `?stream=true` "
    "request per run (its conversations are created before the timing starts)."
)


def main(database_url: str, quick: bool) -> Figures:
    """Measure the rungs L0-L3 back to back and say where each target is lost."""
    figures = Figures(
        "The guarantee floor: engine, durable events, HTTP", "make bench (bench/floor.py)"
    )
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-floor-"))
    env = env_for(
        database_url,
        scripted_models_file=str(write_scripts(folder, {"bench": AGENT_SCRIPT})),
        user_max_active_runs=64,
        tenant_max_active_runs=128,
    )
    runs = {1: 20, 8: 40} if quick else {1: 60, 8: 160}
    repeats = 1 if quick else 3
    procs = start_stack(env, workers=1, concurrency=32)
    with processes(procs):
        floor_proc = start_floor_server(database_url)
        with processes([floor_proc]):
            series = run_async(measure(database_url, procs, floor_proc, runs, repeats))

    figures.add(RUNG_TEXT)
    figures.add("")
    figures.add(
        f"{repeats} repeat(s); in each, the four rungs run back to back at concurrency 1 "
        f"({runs[1]} runs each), then at concurrency 8 ({runs[8]} runs each); every process "
        "stays up throughout, on one embedded Postgres (pools of up to 20 connections). "
        "Latencies are pooled over the repeats; runs/s and CPU are medians over the repeats. "
        "Python CPU is this process's for L0 and L1, the floor server's for L2, API + worker "
        "for L3; Postgres CPU is the whole server's."
    )
    figures.add("")
    for line in tables(series):
        figures.add(line)
    figures.add("")
    figures.add("Against the targets of the runtime-overhead section, the floor (L2) first:")
    figures.add("")
    for line in verdicts(series):
        figures.add(line)
    return figures
