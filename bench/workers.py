"""Worker scaling and recovery: runs/s with 1, 2 and 4 worker processes; time to recover.

The model is scripted with zero latency: one tool call, then a 20-token streamed answer.
Beside runs/s, each worker count reports CPU seconds per run by process (the API, all
workers, Postgres, this benchmark's own client) and how many of the machine's cores were
busy, so that a fall in runs/s can be told apart from a saturated machine; and Postgres
transactions per run, which grow with the worker count: each process's listening backend
spends one on every notification in the database, whatever its channel (docs/decisions/1910).
The counts are measured in turns (each turn runs every count, with fresh worker processes,
the order rotated at each), so that the machine's drift falls on every count alike; each is
warmed up first (`WARM_UP_RUNS`, 32 in flight), so that the figures leave out the pools' new
connections and each new backend's first statements. Transactions per run are counted in
the first turn.

The guarantee floor's rung L3 (bench/floor_worker.py: a queue, leases, fenced writes and a
tool ledger at their least, in a database of its own) runs the same runs at each count in the
same turns, back to back with agentrt, which of the two goes first swapped at each turn: the
scaling target's verdict says whether the floor's runs/s falls too as processes are added,
and what agentrt's most processes do against the floor's best count.

Then each count runs half as many runs one at a time, where all workers but one are idle at
each run: Postgres CPU and transactions per run say what idle workers pay for runs they do
not run. Last, workers that count their function calls (bench/callcount.py) run a batch a count in
turns: calls per run against CPU per run tell code that runs more often with more processes
from the same code run slower by processes that share the machine's cores.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import psycopg

from bench.callcount import CALLS_DIR_ENV, report_path
from bench.client import Endpoint
from bench.common import (
    Figures,
    Proc,
    database_url_for,
    env_for,
    http,
    post_run,
    postgres_cpu_seconds,
    processes,
    run_async,
    start_api,
    start_workers,
    write_scripts,
)
from bench.floor import batch, floor_run, start_floor_server, start_floor_workers
from bench.overhead import Sample, agentrt_run, conversations

FLOOR_DATABASE = "bench_workers_floor"

TOOL_TURN = {"text": "", "tool_calls": [{"name": "calculator", "args": {"expression": "6*7"}}]}
ANSWER = {"text": "word " * 20, "chunk_chars": 5}
SCRIPTS = {
    "bench": [TOOL_TURN, ANSWER],
    "long": [TOOL_TURN, {"text": "tick " * 2000, "chunk_chars": 5, "delay_s": 0.01}],
}


WORKER_CONCURRENCY = 16  # slots per worker process, agentrt's default and the floor's here
WARM_UP_RUNS = 64  # before each worker count's measured runs, not measured
# Idle backends report their statistics at most this long after their last transaction.
STATS_SETTLE_S = 11.0
WORK_TURNS = 2  # turns of counting batches, every count in each, the order rotated
# CPU per call this much higher with more processes reads as the same work run slower.
SLOWER_PER_CALL = 1.05


@dataclass
class Work:
    """Function calls per run in the workers' main threads, and their CPU seconds per run.

    Measured on workers that count their calls (bench/callcount.py), which slows them: the
    CPU figure is for comparing counts with each other, not with the other tables.
    """

    calls: float
    cpu: float

    def __add__(self, other: Work) -> Work:
        return Work(self.calls + other.calls, self.cpu + other.cpu)

    def __truediv__(self, by: float) -> Work:
        return Work(self.calls / by, self.cpu / by)

    @property
    def per_call_ns(self) -> float:
        """CPU nanoseconds per function call."""
        return self.cpu / self.calls * 1e9


@dataclass
class Cost:
    """CPU seconds per run by process, cores busy, Postgres transactions per run."""

    api: float
    workers: float
    postgres: float
    client: float
    cores: float
    xacts: float

    @property
    def total(self) -> float:
        """CPU seconds per run of everything on the machine that serves the runs."""
        return self.api + self.workers + self.postgres + self.client


def transactions(database_url: str) -> int:
    """Transactions committed or rolled back in the benchmark's database so far."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def throughput(url: str, runs: int, concurrency: int) -> float:
    """Post `runs` runs, `concurrency` at a time, each followed to its end; return runs/s."""
    ep = Endpoint.of(url)
    convs = await conversations(ep, runs)
    gate = asyncio.Semaphore(concurrency)

    async def one(conv: str) -> None:
        async with gate:
            await agentrt_run(ep, conv)

    started = time.perf_counter()
    async with asyncio.timeout(600):
        await asyncio.gather(*(one(c) for c in convs))
    return runs / (time.perf_counter() - started)


def main(database_url: str, quick: bool) -> Figures:
    """Measure runs per second with one, two and four worker processes, and the floor's."""
    figures = Figures("Worker processes: throughput and recovery", "make bench (bench/workers.py)")
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-workers-"))
    scripts = write_scripts(folder, SCRIPTS)
    # One user posts all runs: lift the per-user limit (8) so that 32 can be in flight.
    env = env_for(
        database_url,
        scripted_models_file=str(scripts),
        user_max_active_runs=64,
        tenant_max_active_runs=128,
    )
    runs = 40 if quick else 200
    repeats = 1 if quick else 3
    counts = (1, 2) if quick else (1, 2, 4)
    # The floor's queue in a database of its own, so that neither stack's notifications wake
    # the other's listening backends (docs/decisions/1910).
    floor_url = database_url_for(database_url, FLOOR_DATABASE)
    api = start_api(env)
    floor_server = start_floor_server(floor_url, queued=True)
    assert api.url is not None
    with processes([api, floor_server]):
        rates: dict[int, list[float]] = {count: [] for count in counts}
        floor: dict[int, list[Sample]] = {count: [] for count in counts}
        spent: dict[int, list[float]] = {count: [0.0] * 5 for count in counts}
        xacts: dict[int, float] = {}
        # In turns, each turn with every worker count and the order rotated at each, so that
        # the machine's drift falls on every count alike; the floor and agentrt back to back
        # at each count, which goes first swapped at each turn.
        for turn in range(repeats):
            for count in counts[turn % len(counts) :] + counts[: turn % len(counts)]:
                if turn % 2 == 0:
                    floor[count].append(_measure_floor(floor_server, floor_url, count, runs))
                rate, cost, per_run_xacts = _measure(api, env, database_url, count, runs, turn == 0)
                if turn % 2 == 1:
                    floor[count].append(_measure_floor(floor_server, floor_url, count, runs))
                rates[count].append(rate)
                spent[count] = [a + b for a, b in zip(spent[count], cost, strict=True)]
                if per_run_xacts is not None:
                    xacts[count] = per_run_xacts
        figures.add("| worker processes | runs/s (median) | spread | repeats |")
        figures.add("|---|---|---|---|")
        for count in counts:
            figures.add(
                f"| {count} | {statistics.median(rates[count]):.1f} | "
                f"{max(rates[count]) - min(rates[count]):.1f} | "
                f"{repeats} x {runs} runs, 32 in flight |"
            )
        figures.add("")
        _add_costs(figures, counts, spent, xacts, runs * repeats)
        figures.add("")
        _add_floor(figures, counts, rates, floor, spent, runs * repeats)
        figures.add("")
        _add_one_at_a_time(
            figures,
            {
                count: _measure(api, env, database_url, count, runs // 2, True, in_flight=1)
                for count in counts
            },
            runs // 2,
        )
        figures.add("")
        work = {count: Work(0.0, 0.0) for count in counts}
        for turn in range(WORK_TURNS):
            for count in counts[turn % len(counts) :] + counts[: turn % len(counts)]:
                work[count] = work[count] + _measure_work(api, env, count, runs, folder)
        _add_work(figures, {count: w / WORK_TURNS for count, w in work.items()})
        figures.add("")
        times = []
        for _ in range(1 if quick else 3):
            times.append(run_async(_recover_once(api.url, env)))
        figures.add(
            f"Recovery after `kill -9` of the worker running a run (default lease "
            f"settings, 2 workers): median {statistics.median(times):.1f} s from the kill to "
            f"the run's next event (all: {', '.join(f'{t:.1f}' for t in times)} s). "
            "Target: ≤ 15 s."
        )
    return figures


def _add_costs(
    figures: Figures,
    counts: tuple[int, ...],
    spent: dict[int, list[float]],
    xacts: dict[int, float],
    total_runs: int,
) -> None:
    costs: dict[int, Cost] = {}
    for count in counts:
        api_s, workers_s, pg_s, client_s, wall_s = spent[count]
        costs[count] = Cost(
            api=api_s / total_runs,
            workers=workers_s / total_runs,
            postgres=pg_s / total_runs,
            client=client_s / total_runs,
            cores=(api_s + workers_s + pg_s + client_s) / wall_s,
            xacts=xacts[count],
        )
    figures.add(
        "CPU per run by process (ms), cores busy (all CPU seconds over wall seconds; the "
        f"machine has {os.cpu_count()}) and Postgres transactions per run:"
    )
    figures.add("")
    figures.add(
        "| worker processes | API | workers | Postgres | benchmark client | total "
        "| cores busy | transactions/run |"
    )
    figures.add("|---|---|---|---|---|---|---|---|")
    for count, c in costs.items():
        figures.add(
            f"| {count} | {c.api * 1000:.1f} | {c.workers * 1000:.1f} | "
            f"{c.postgres * 1000:.1f} | {c.client * 1000:.1f} | {c.total * 1000:.1f} | "
            f"{c.cores:.2f} | {c.xacts:.1f} |"
        )


def _add_floor(
    figures: Figures,
    counts: tuple[int, ...],
    rates: dict[int, list[float]],
    floor: dict[int, list[Sample]],
    spent: dict[int, list[float]],
    total_runs: int,
) -> None:
    """The floor's runs/s beside agentrt's, and each one's step from one count to the next."""
    figures.add(
        "The same runs on the guarantee floor's rung L3 (bench/floor_worker.py; see the "
        "guarantee floor's section), measured in the same turns, back to back with agentrt at "
        "each count: a server that only queues the run and streams what a worker process "
        "commits; workers of as many slots as agentrt's that claim the oldest queued run "
        "(`FOR UPDATE SKIP LOCKED`, no lock between claims, no limits), renew their leases, "
        "fence every write and record each tool call. It keeps what lets a run outlive the "
        "processes that accept and run it, and a gapless stream of committed events, and "
        "nothing else. Python CPU is the server's and the workers'; Postgres CPU the whole "
        "server's."
    )
    figures.add("")
    figures.add(
        "| worker processes | floor runs/s | agentrt runs/s | agentrt against the floor "
        "| floor Python CPU/run | agentrt Python CPU/run | floor Postgres CPU/run "
        "| agentrt Postgres CPU/run |"
    )
    figures.add("|---|---|---|---|---|---|---|---|")
    for count in counts:
        turns = floor[count]
        paired = [a / f.rate for a, f in zip(rates[count], turns, strict=True)]
        api_s, workers_s, pg_s, _client, _wall = spent[count]
        figures.add(
            f"| {count} | {statistics.median(f.rate for f in turns):.1f} | "
            f"{statistics.median(rates[count]):.1f} | {statistics.median(paired):.2f}x | "
            f"{statistics.median(f.cpu for f in turns) * 1000:.1f} ms | "
            f"{(api_s + workers_s) / total_runs * 1000:.1f} ms | "
            f"{statistics.median(f.pg_cpu for f in turns) * 1000:.1f} ms | "
            f"{pg_s / total_runs * 1000:.1f} ms |"
        )
    figures.add("")
    steps, falls = [], []
    for fewer, more in itertools.pairwise(counts):
        ours = [b / a for a, b in zip(rates[fewer], rates[more], strict=True)]
        theirs = [b.rate / a.rate for a, b in zip(floor[fewer], floor[more], strict=True)]
        steps.append(
            f"from {fewer} to {more}: agentrt {statistics.median(ours):.2f}x "
            f"({', '.join(f'{r:.2f}' for r in ours)}), the floor "
            f"{statistics.median(theirs):.2f}x ({', '.join(f'{r:.2f}' for r in theirs)})"
        )
        falls.append((statistics.median(ours) < 1, statistics.median(theirs) < 1))
    verdict = "**missed**" if any(ours for ours, _ in falls) else "**met**"
    floor_falls = any(theirs for _, theirs in falls)
    best_count = max(counts, key=lambda count: statistics.median(f.rate for f in floor[count]))
    best = statistics.median(f.rate for f in floor[best_count])
    most = counts[-1]
    figures.add(
        "Runs/s as processes are added, each turn's figure against the same turn's with fewer "
        f"processes (median; each turn): {'; '.join(steps)}. Target: no fall as processes "
        f"are added: {verdict} by agentrt; the floor "
        f"{'falls too' if floor_falls else 'does not fall'}. With {most} processes agentrt does "
        f"{statistics.median(rates[most]) / best:.2f}x the runs/s of the floor's best count "
        f"({best_count}, {best:.1f} runs/s). The machine has {os.cpu_count()} cores; cores "
        "busy (above) says how near two and four processes come to keeping them all busy."
    )


def _add_one_at_a_time(
    figures: Figures,
    measured: dict[int, tuple[float, list[float], float | None]],
    runs: int,
) -> None:
    """What each count costs a run when the runs come one at a time and most workers idle."""
    figures.add(
        f"One run at a time ({runs} runs, each posted when the one before ended, on fresh "
        "workers after the same warm-up): every worker process but one is idle at each run, "
        "so what idle workers do for runs they do not run shows here."
    )
    figures.add("")
    figures.add(
        "| worker processes | runs/s | API + workers CPU/run | Postgres CPU/run "
        "| transactions/run |"
    )
    figures.add("|---|---|---|---|---|")
    for count, (rate, spent, xacts) in measured.items():
        api_s, workers_s, pg_s = spent[0], spent[1], spent[2]
        figures.add(
            f"| {count} | {rate:.1f} | {(api_s + workers_s) / runs * 1000:.1f} ms | "
            f"{pg_s / runs * 1000:.1f} ms | {xacts or 0:.1f} |"
        )
    figures.add("")
    first, last = min(measured), max(measured)
    pg_first, pg_last = measured[first][1][2], measured[last][1][2]
    added = (
        ((measured[last][2] or 0) - (measured[first][2] or 0)) / (last - first)
        if last > first
        else 0.0
    )
    figures.add(
        f"Postgres CPU per run with {last} processes against {first}, one run at a time: "
        f"{pg_last / pg_first:.2f}x; {added:.1f} transactions more per run for each process "
        "added. A queued run's notification names one worker, and idle workers leave other "
        "workers' runs to them (docs/decisions/2055); each process's listening backend still "
        "spends a transaction on every notification in the database (docs/decisions/1910)."
    )


def _add_work(figures: Figures, work: dict[int, Work]) -> None:
    """Calls per run beside CPU per run: whether more processes do more work or run slower."""
    figures.add(
        "Work per run against CPU per run: the function calls the workers' main threads make "
        "per run (cProfile's count, Python and built-in; bench/callcount.py), on fresh workers "
        f"that count them, after the turns above: {WORK_TURNS} turns of a batch a count, the "
        "order rotated, the batches of a count added up. Counting slows every call, so "
        "their CPU per run here is above the table's; what matters is how each count's "
        "figures compare with the others'."
    )
    figures.add("")
    figures.add("| worker processes | calls/run | workers' CPU/run (counting) | CPU per call |")
    figures.add("|---|---|---|---|")
    for count, w in work.items():
        figures.add(
            f"| {count} | {w.calls:,.0f} | {w.cpu * 1000:.1f} ms | {w.per_call_ns:,.0f} ns |"
        )
    figures.add("")
    steps = []
    for fewer, more in itertools.pairwise(work):
        a, b = work[fewer], work[more]
        slower = b.per_call_ns / a.per_call_ns
        reading = (
            "the same work costs more per call"
            if slower >= SLOWER_PER_CALL
            else "CPU follows the work"
        )
        steps.append(
            f"from {fewer} to {more} processes the calls per run are {b.calls / a.calls:.2f}x, "
            f"the CPU per run {b.cpu / a.cpu:.2f}x and the CPU per call {slower:.2f}x "
            f"({reading})"
        )
    said = "; ".join(steps)
    said = f"{said[0].upper()}{said[1:]}."
    if any("costs more" in step for step in steps):
        said += (
            " A call that costs more with more processes is the machine's, not the code's: "
            "processes that wait for a core, and find their caches taken by the others when "
            "they get one."
        )
    figures.add(said)


def _read_calls(folder: Path, workers: list[Proc]) -> int:
    """Signal every counting worker and add up the calls each reports."""
    paths = [report_path(folder, p.popen.pid) for p in workers]
    for path in paths:
        path.unlink(missing_ok=True)
    for p in workers:
        p.kill(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while not all(path.exists() for path in paths):
        if time.monotonic() > deadline:
            raise RuntimeError("a counting worker did not report its calls within 30 s")
        time.sleep(0.05)
    return sum(int(path.read_text()) for path in paths)


def _measure_work(api: Proc, env: dict[str, str], count: int, runs: int, folder: Path) -> Work:
    """Calls and CPU per run of `runs` runs, 32 in flight, on `count` counting workers."""
    assert api.url is not None
    calls_dir = folder / "calls"
    calls_dir.mkdir(exist_ok=True)
    workers = start_workers(
        {**env, CALLS_DIR_ENV: str(calls_dir)}, count, WORKER_CONCURRENCY, count_calls=True
    )
    with processes(workers):
        run_async(throughput(api.url, WARM_UP_RUNS, 32))
        calls0 = _read_calls(calls_dir, workers)
        cpu0 = sum(p.cpu_seconds() for p in workers)
        run_async(throughput(api.url, runs, 32))
        cpu = sum(p.cpu_seconds() for p in workers) - cpu0
        calls = _read_calls(calls_dir, workers) - calls0
    return Work(calls=calls / runs, cpu=cpu / runs)


def _measure_floor(server: Proc, floor_url: str, count: int, runs: int) -> Sample:
    """Measure `runs` floor runs, 32 in flight, on `count` fresh floor worker processes.

    Its `cpu` is the floor server's and workers', per run.
    """
    assert server.url is not None
    ep = Endpoint.of(server.url)
    workers = start_floor_workers(floor_url, count, concurrency=WORKER_CONCURRENCY)

    async def one() -> float:
        times = await floor_run(ep)
        return times.end - times.start

    def cpu() -> float:
        return sum(p.cpu_seconds() for p in (server, *workers))

    with processes(workers):
        run_async(batch(one, WARM_UP_RUNS, 32, cpu, floor_url))
        return cast(Sample, run_async(batch(one, runs, 32, cpu, floor_url)))


def _measure(
    api: Proc,
    env: dict[str, str],
    database_url: str,
    count: int,
    runs: int,
    count_xacts: bool,
    in_flight: int = 32,
) -> tuple[float, list[float], float | None]:
    """Measure `runs` runs, `in_flight` at a time, on `count` fresh worker processes.

    Returns runs/s; CPU seconds of the API, the workers, Postgres and this client, and the
    wall seconds; and Postgres transactions per run if `count_xacts`.
    """
    assert api.url is not None
    workers = start_workers(env, count, WORKER_CONCURRENCY)
    # Warm up at 32 in flight: the workers' pools open the connections that 32 runs in flight
    # need, and each new Postgres backend fills its caches. Long-lived workers pay that once,
    # so it is kept out of the figures.
    with processes(workers):
        run_async(throughput(api.url, WARM_UP_RUNS, 32))
        if count_xacts:
            time.sleep(STATS_SETTLE_S)
        xact0 = transactions(database_url)
        cpu0 = [p.cpu_seconds() for p in (api, *workers)]
        pg0, own0, wall0 = postgres_cpu_seconds(database_url), os.times(), time.time()
        rate = run_async(throughput(api.url, runs, in_flight))
        cpu = [p.cpu_seconds() - c for p, c in zip((api, *workers), cpu0, strict=True)]
        pg, own, wall = postgres_cpu_seconds(database_url) - pg0, os.times(), time.time()
    client = (own.user + own.system) - (own0.user + own0.system)
    per_run_xacts = None
    if count_xacts:
        time.sleep(STATS_SETTLE_S)  # the API's idle backends report their transactions
        per_run_xacts = (transactions(database_url) - xact0) / runs
    return rate, [cpu[0], sum(cpu[1:]), pg, client, wall - wall0], per_run_xacts


async def _recover_once(url: str, env: dict[str, str]) -> float:
    workers = start_workers(env, 2, 4)
    with processes(workers):
        async with http(url) as client:
            run_id = await post_run(client, "scripted:long")
            while True:
                snap = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
                if snap["items"] and len(snap["items"][-1]["text"]) > 50:
                    break
                await asyncio.sleep(0.01)
            owner = (await client.get(f"/api/runs/{run_id}")).json()["leaseOwner"]
            victim = next(w for w in workers if f":{w.popen.pid}:" in owner)
            seen = snap["lastEventId"]
            victim.kill()
            killed = time.perf_counter()
            while True:
                record = (await client.get(f"/api/runs/{run_id}")).json()
                if record["lastEventId"] > seen + 1 and record["attempt"] == 2:
                    took = time.perf_counter() - killed
                    break
                await asyncio.sleep(0.05)
            await client.post(f"/api/runs/{run_id}/cancel")
    return took
