"""Runtime overhead: agentrt against the engine floor, per-run latency, runs/s and CPU per run.

The same graph (one calculator call, then a 20-chunk streamed answer; scripted model with zero
latency) runs (a) in this process on LangGraph's `AsyncPostgresSaver` (bench/engine.py) and
(b) through agentrt: POST a message -> queue -> worker process -> event log -> SSE client
sees `run.completed`. Both run back to back in every repeat, on the same Postgres.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.client import Endpoint, request, sse
from bench.common import (
    Figures,
    Proc,
    database_url_for,
    env_for,
    met,
    postgres_cpu_seconds,
    processes,
    quantiles,
    run_async,
    start_api,
    start_stack,
    trust,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT, TOOL_TURN, Engine, engine

CONCURRENCY = (1, 8, 32)
# The same run with a model that streams its 20 chunks at 100/s (still faster than most
# hosted models): what the fixed costs weigh once the model takes time.
PACED_SCRIPT = [
    {**TOOL_TURN, "delay_s": 0.01},
    {"text": "word " * 20, "chunk_chars": 5, "delay_s": 0.01},
]


@dataclass
class Sample:
    """One measured batch: latencies, runs/s, CPU seconds per run (ours, Postgres)."""

    latencies: list[float]
    rate: float
    cpu: float
    pg_cpu: float
    wal: float = 0.0  # WAL bytes per run (the floor's batches; 0 where not measured)


@dataclass
class Series:
    """Samples of one measured quantity for agentrt and the engine."""

    floor: dict[int, list[Sample]] = field(default_factory=dict)
    ours: dict[int, list[Sample]] = field(default_factory=dict)
    paced: tuple[list[float], list[float]] = ([], [])
    creation: list[float] = field(default_factory=list)
    two_requests: list[float] = field(default_factory=list)


async def conversations(ep: Endpoint, count: int, times: list[float] | None = None) -> list[str]:
    """Create `count` conversations one at a time, outside the runs' timing.

    With `times`, each creation's seconds are appended to it (reported on their own).
    """
    made = []
    for _ in range(count):
        started = time.perf_counter()
        made.append((await request(ep, "POST", "/api/conversations", {}))["conversationId"])
        if times is not None:
            times.append(time.perf_counter() - started)
    return made


async def agentrt_run(
    ep: Endpoint, conversation: str, model: str = "scripted:bench", *, streamed: bool = True
) -> float:
    """Post a message and read its stream to `run.completed`; return the seconds taken.

    Streamed: one request (`?stream=true` answers with the run's events). Otherwise two: the
    POST, then `GET /api/runs/{id}/events`.
    """
    started = time.perf_counter()
    path, body = f"/api/conversations/{conversation}/messages", {"content": "go", "model": model}
    if streamed:
        times = await sse(ep, f"{path}?stream=true", method="POST", payload=body)
    else:
        run = await request(ep, "POST", path, body)
        times = await sse(ep, f"/api/runs/{run['runId']}/events")
    if times.terminal != "run.completed":
        raise RuntimeError(f"a run of {conversation} ended {times.terminal or 'without an end'}")
    return float(times.end - started)


async def agentrt_batch(
    ep: Endpoint,
    runs: int,
    concurrency: int,
    procs: list[Proc],
    database_url: str,
    creation: list[float] | None = None,
) -> Sample:
    """Run one batch through agentrt's HTTP API and return its sample.

    With `creation`, the seconds each of its conversations took to create are appended.
    """
    convs = await conversations(ep, runs, creation)
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(conv: str) -> None:
        async with gate:
            latencies.append(await agentrt_run(ep, conv))

    cpu0 = sum(p.cpu_seconds() for p in procs)
    pg0 = postgres_cpu_seconds(database_url)
    started = time.perf_counter()
    async with asyncio.timeout(600):
        await asyncio.gather(*(one(c) for c in convs))
    rate = runs / (time.perf_counter() - started)
    cpu = (sum(p.cpu_seconds() for p in procs) - cpu0) / runs
    return Sample(latencies, rate, cpu, (postgres_cpu_seconds(database_url) - pg0) / runs)


async def floor_batch(eng: Engine, runs: int, concurrency: int, database_url: str) -> Sample:
    """Run one batch on the bare engine and return its sample."""
    cpu0, pg0 = time.process_time(), postgres_cpu_seconds(database_url)
    latencies, rate = await eng.throughput(runs, concurrency)
    cpu = (time.process_time() - cpu0) / runs
    return Sample(latencies, rate, cpu, (postgres_cpu_seconds(database_url) - pg0) / runs)


async def paced(database_url: str, ep: Endpoint, runs: int) -> tuple[list[float], list[float]]:
    """Latencies of the engine and of agentrt, one run at a time, with the paced model."""
    floor, ours = [], []
    async with engine(database_url, PACED_SCRIPT) as eng:
        eng.durability = "sync"
        for conv in await conversations(ep, runs):
            floor.append((await eng.run())[2])
            ours.append(await agentrt_run(ep, conv, "scripted:paced"))
    return floor, ours


async def measure(
    database_url: str,
    ep: Endpoint,
    procs: list[Proc],
    runs: dict[int, int],
    repeats: int,
    levels: tuple[int, ...] = CONCURRENCY,
    extras: bool = True,
) -> Series:
    """Run agentrt and the engine side by side at each concurrency level of `levels`.

    With `extras`, also the two-request flow and the paced model.
    """
    series = Series()
    async with engine(database_url) as eng:
        eng.durability = "sync"  # agentrt's executor stores each step's checkpoint before the next
        await eng.throughput(10, 2)  # warm up both paths: imports, pools, caches
        for conv in await conversations(ep, 10):
            await agentrt_run(ep, conv)
        for _ in range(repeats):
            for c in levels:
                series.floor.setdefault(c, []).append(
                    await floor_batch(eng, runs[c], c, database_url)
                )
                series.ours.setdefault(c, []).append(
                    await agentrt_batch(
                        ep, runs[c], c, procs, database_url, series.creation if c == 1 else None
                    )
                )
            if extras:
                for conv in await conversations(ep, runs[1]):
                    series.two_requests.append(await agentrt_run(ep, conv, streamed=False))
        if extras:
            series.paced = await paced(database_url, ep, 5 if runs[1] < 60 else runs[1] // 2)
    return series


def _median(samples: list[Sample], pick: str) -> float:
    return statistics.median(getattr(s, pick) for s in samples)


def main(database_url: str, quick: bool) -> Figures:
    """Measure agentrt's latency, throughput and CPU against the bare engine."""
    figures = Figures("Runtime overhead against the engine floor", "make bench (bench/overhead.py)")
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-overhead-"))
    scripts = write_scripts(folder, {"bench": AGENT_SCRIPT, "paced": PACED_SCRIPT})
    env = env_for(
        database_url,
        scripted_models_file=str(scripts),
        user_max_active_runs=64,
        tenant_max_active_runs=128,
    )
    runs = {1: 20, 8: 40, 32: 64} if quick else {1: 60, 8: 160, 32: 320}
    repeats = 1 if quick else 3
    procs = start_stack(env, workers=1, concurrency=32)
    assert procs[0].url is not None
    with processes(procs):
        series = run_async(measure(database_url, Endpoint.of(procs[0].url), procs, runs, repeats))
    # The default deployment (`make run`): one process serves the API and runs the workers.
    # Its own database, so that neither stack's workers claim the other's runs.
    one_url = database_url_for(database_url, "bench_overhead_one_process")
    api = start_api(
        {**env, "DATABASE_URL": one_url, "AGENTRT_WORKER_CONCURRENCY": "32"}, workers=True
    )
    assert api.url is not None
    with processes([api]):
        one = run_async(
            measure(one_url, Endpoint.of(api.url), [api], runs, repeats, (1, 8), extras=False)
        )

    figures.add(
        "Topology: one API process (`agentrt serve --no-workers`) and one worker process "
        '(concurrency 32), against the engine in one process (`durability="sync"`, as agentrt\'s '
        "executor); both on the same embedded "
        f"Postgres, pool of 20 connections each. {repeats} repeat(s), engine and agentrt back "
        "to back in each; figures are medians over the repeats. A run is one request: the "
        "message POSTed with `?stream=true`, read to `run.completed`."
    )
    figures.add("")
    floor1 = [x for s in series.floor[1] for x in s.latencies]
    ours1 = [x for s in series.ours[1] for x in s.latencies]
    qf, qo = quantiles(floor1), quantiles(ours1)
    ratio1 = qo["p50"] / qf["p50"]
    figures.add("| concurrency 1 | engine floor | agentrt | ratio | target |")
    figures.add("|---|---|---|---|---|")
    figures.add(
        f"| latency p50 | {qf['p50'] * 1000:.1f} ms | {qo['p50'] * 1000:.1f} ms | "
        f"{ratio1:.2f}x | ≤ 1.5x {met(ratio1 <= 1.5)} |"
    )
    figures.add(
        f"| latency p95 | {qf['p95'] * 1000:.1f} ms | {qo['p95'] * 1000:.1f} ms | "
        f"{qo['p95'] / qf['p95']:.2f}x | |"
    )
    qt = quantiles(series.two_requests)
    figures.add(
        "| latency p50 with two requests (POST, then GET of the stream; "
        f"n={len(series.two_requests)}) "
        f"| {qf['p50'] * 1000:.1f} ms | {qt['p50'] * 1000:.1f} ms | {qt['p50'] / qf['p50']:.2f}x | "
        "context: the client's choice |"
    )
    qc = quantiles(series.creation)
    figures.add(
        f"| conversation creation (`POST /api/conversations`, not in the latency above) | | "
        f"{qc['p50'] * 1000:.1f} ms (p95 {qc['p95'] * 1000:.1f} ms) | | reported on its own |"
    )
    pf, po = quantiles(series.paced[0]), quantiles(series.paced[1])
    figures.add(
        f"| latency p50, model streaming at 100 chunks/s (n={len(series.paced[0])}) | "
        f"{pf['p50'] * 1000:.1f} ms | {po['p50'] * 1000:.1f} ms | {po['p50'] / pf['p50']:.2f}x "
        "| context, not the target |"
    )
    figures.add("")
    figures.add("| concurrency | engine runs/s | agentrt runs/s | ratio | target | repeats |")
    figures.add("|---|---|---|---|---|---|")
    for c in CONCURRENCY[1:]:
        f_rate, o_rate = _median(series.floor[c], "rate"), _median(series.ours[c], "rate")
        ratios = [o.rate / f.rate for f, o in zip(series.floor[c], series.ours[c], strict=True)]
        figures.add(
            f"| {c} | {f_rate:.1f} | {o_rate:.1f} | {statistics.median(ratios):.2f}x | "
            f"≥ 0.7x {met(statistics.median(ratios) >= 0.7)} | {trust(ratios)} |"
        )
    figures.add("")
    figures.add(
        "| concurrency | engine CPU/run | agentrt CPU/run (API + worker) | difference | "
        "target | Postgres CPU/run engine → agentrt |"
    )
    figures.add("|---|---|---|---|---|---|")
    for c in CONCURRENCY:
        f_cpu, o_cpu = _median(series.floor[c], "cpu"), _median(series.ours[c], "cpu")
        f_pg, o_pg = _median(series.floor[c], "pg_cpu"), _median(series.ours[c], "pg_cpu")
        extra = (o_cpu - f_cpu) * 1000
        figures.add(
            f"| {c} | {f_cpu * 1000:.1f} ms | {o_cpu * 1000:.1f} ms | +{extra:.1f} ms "
            f"({o_cpu / f_cpu:.2f}x) | ≤ +8 ms {met(extra <= 8)} | "
            f"{f_pg * 1000:.1f} → {o_pg * 1000:.1f} ms ({o_pg / f_pg:.2f}x,"
            f" ≤ 2x {met(o_pg <= 2 * f_pg)}) |"
        )
    rates = [s.rate for s in series.ours[32]]
    figures.add("")
    figures.add(f"agentrt runs/s at concurrency 32 across repeats: {trust(rates)}.")
    _one_process(figures, one)
    return figures


def _one_process(figures: Figures, one: Series) -> None:
    """The same targets with one process serving the API and running the workers."""
    figures.add("")
    figures.add(
        "The default deployment, measured right after in the same way: one process "
        "(`agentrt serve`, as `make run` starts it) serves the API and runs the workers "
        "(concurrency 32), on a database of its own."
    )
    figures.add("")
    floor1 = quantiles([x for s in one.floor[1] for x in s.latencies])
    ours1 = quantiles([x for s in one.ours[1] for x in s.latencies])
    ratio1 = ours1["p50"] / floor1["p50"]
    ratios8 = [o.rate / f.rate for f, o in zip(one.floor[8], one.ours[8], strict=True)]
    rate8 = statistics.median(ratios8)
    figures.add("| one process | engine floor | agentrt | ratio or difference | target |")
    figures.add("|---|---|---|---|---|")
    figures.add(
        f"| latency p50, concurrency 1 | {floor1['p50'] * 1000:.1f} ms | "
        f"{ours1['p50'] * 1000:.1f} ms | {ratio1:.2f}x | ≤ 1.5x {met(ratio1 <= 1.5)} |"
    )
    figures.add(
        f"| runs/s, concurrency 8 | {_median(one.floor[8], 'rate'):.1f} | "
        f"{_median(one.ours[8], 'rate'):.1f} | {rate8:.2f}x ({trust(ratios8)}) | "
        f"≥ 0.7x {met(rate8 >= 0.7)} |"
    )
    for c in (1, 8):
        f_cpu, o_cpu = _median(one.floor[c], "cpu"), _median(one.ours[c], "cpu")
        f_pg, o_pg = _median(one.floor[c], "pg_cpu"), _median(one.ours[c], "pg_cpu")
        extra = (o_cpu - f_cpu) * 1000
        figures.add(
            f"| CPU per run, concurrency {c} | {f_cpu * 1000:.1f} ms | {o_cpu * 1000:.1f} ms | "
            f"+{extra:.1f} ms | ≤ +8 ms {met(extra <= 8)} |"
        )
        figures.add(
            f"| Postgres CPU per run, concurrency {c} | {f_pg * 1000:.1f} ms | "
            f"{o_pg * 1000:.1f} ms | {o_pg / f_pg:.2f}x | ≤ 2x {met(o_pg <= 2 * f_pg)} |"
        )
