"""The guarantee floor: what agentrt's guarantees cost at minimum, rung by rung, against it.

Five rungs run the same graph and scripted model as bench/engine.py (one calculator call, then
20 streamed chunks), all with `durability="sync"`, back to back and interleaved in every
repeat, on the same Postgres:

- L0, the engine: `Engine.run()` in this process.
- L1, + a gapless event log: every stream part committed to Postgres before it counts as
  delivered (bench/floor_log.py), in this process.
- L2, + served over HTTP: L1 inside a minimal server process (bench/floor_server.py); the
  client POSTs `/runs` and reads committed events as SSE to the terminal event.
- L3, + crash-safe execution: L2's server only queues the run; a worker process claims it
  with a lease, fences every write of the attempt and records tool calls in a ledger
  (bench/floor_worker.py); the server streams what the worker commits.
- L4, agentrt: API and worker processes, one `?stream=true` request per run.

L0 stores checkpoints with LangGraph's saver as it ships; L1 to L3 with agentrt's
`InlinePostgresSaver` (the same rows, without the thread hop), as L4 does, so that each rung
is its mechanism at its least. L3, whose attempts are fenced, holds a step's task writes for
the step's checkpoint and stores them in its transaction, the input checkpoint in the first
step's, the checkpoints of the steps a later attempt runs again at no cost (the first step,
building the context, the tools' step) in the next write's (a checkpoint or an event batch,
ahead of its events), and the graph's last checkpoint in the transaction that ends the run
(`HoldingPostgresSaver`), as L4 does.

L2 is the least any server with agentrt's stream guarantee pays, L3 the least with its other
guarantees too; L4 minus L3 is agentrt's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.client import Endpoint, StreamTimes, request, sse
from bench.common import (
    ROOT,
    Figures,
    Proc,
    env_for,
    free_port,
    postgres_cpu_seconds,
    processes,
    run_async,
    start_stack,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT, Engine, engine
from bench.floor_log import Pool, durable_run, event_pool
from bench.floor_report import LEVELS, RUNG_TEXT, RUNGS, Series, tables, verdicts
from bench.overhead import Sample, conversations
from server.db.checkpoint import InlinePostgresSaver


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

    # The WAL position is read through a connection of its own: outside the CPU readings.
    wal0 = wal_bytes(database_url)
    cpu0, pg0 = cpu(), postgres_cpu_seconds(database_url)
    started = time.perf_counter()
    async with asyncio.timeout(600):
        await asyncio.gather(*(timed() for _ in range(runs)))
    rate = runs / (time.perf_counter() - started)
    ours, pg = (cpu() - cpu0) / runs, (postgres_cpu_seconds(database_url) - pg0) / runs
    return Sample(latencies, rate, ours, pg, (wal_bytes(database_url) - wal0) / runs)


def wal_bytes(database_url: str) -> int:
    """The server's WAL insert position, in bytes: what every database on it has written."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _spawn(args: list[str], database_url: str) -> tuple[subprocess.Popen[bytes], Path]:
    fd, log = tempfile.mkstemp(prefix="agentrt-bench-floor-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        popen = subprocess.Popen(
            [*args, "--database-url", database_url],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return popen, Path(log)


def _await_ready(proc: Proc, what: str, ready: Callable[[], bool], limit_s: float) -> Proc:
    """Wait until `ready()` says the process is up; kill it if it exits or takes too long."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if ready():
            return proc
        if proc.popen.poll() is not None:
            raise RuntimeError(f"the {what} exited at start:\n{proc.tail()}")
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"the {what} did not become ready:\n{proc.tail()}")


def start_floor_worker(database_url: str, limit_s: float = 60) -> Proc:
    """Start bench/floor_worker.py (rung L3's worker); wait until its log says it is ready."""
    return start_floor_workers(database_url, 1, limit_s=limit_s)[0]


def start_floor_workers(
    database_url: str, count: int, concurrency: int | None = None, limit_s: float = 60
) -> list[Proc]:
    """Start `count` floor workers side by side (of `concurrency` slots each, else its default).

    Waits until the log of each says it is ready.
    """
    args = [sys.executable, "-m", "bench.floor_worker"]
    if concurrency is not None:
        args += ["--concurrency", str(concurrency)]
    spawned = [_spawn(args, database_url) for _ in range(count)]
    procs = [Proc(popen, None, log) for popen, log in spawned]
    try:
        return [
            _await_ready(proc, "floor worker", functools.partial(_says_ready, log), limit_s)
            for proc, (_, log) in zip(procs, spawned, strict=True)
        ]
    except BaseException:
        for proc in procs:
            proc.kill()
        raise


def _says_ready(log: Path) -> bool:
    return "ready" in log.read_text(errors="replace").split()


def start_floor_server(database_url: str, queued: bool = False, limit_s: float = 60) -> Proc:
    """Start bench/floor_server.py on a free port; wait until it answers /readyz.

    `queued`: rung L3's server, which leaves the runs to bench/floor_worker.py.
    """
    port = free_port()
    args = [sys.executable, "-m", "bench.floor_server", "--port", str(port)]
    popen, log = _spawn([*args, "--queued"] if queued else args, database_url)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        return False

    return _await_ready(Proc(popen, url, log), "floor server", answers, limit_s)


# A floor's event for a piece of text, not an empty chunk (bench/floor_log.py `encode`).
DELTA = '"type": "delta", "text": "[^"]'


async def floor_run(ep: Endpoint, rung: str = "L3", on_frames: Any = None) -> StreamTimes:
    """POST one run to a floor server (`rung`'s) and read its events to the end."""
    times = await sse(ep, "/runs", method="POST", payload={"input": "go"}, on_frames=on_frames)
    if times.terminal != "run.completed":
        raise RuntimeError(f"an {rung} run ended {times.terminal or 'without an end'}")
    return times


class _FirstToken:
    """An `on_frames` callback that notes when the first frame matching `marker` arrived."""

    def __init__(self, marker: bytes) -> None:
        self.marker = re.compile(marker)
        self.at = 0.0

    def __call__(self, now: float, frames: bytes) -> None:
        if not self.at and self.marker.search(frames):
            self.at = now


@dataclass
class Rungs:
    """What each rung needs: the in-process engines and pool, the three servers."""

    eng: Engine  # L0: LangGraph's saver as it ships
    durable_eng: Engine  # L1: the same graph on the saver without the thread hop
    pool: Pool
    floor_ep: Endpoint
    floor_proc: Proc
    queued_ep: Endpoint
    queued_procs: list[Proc]  # L3's server and worker
    agentrt_ep: Endpoint
    agentrt_procs: list[Proc]
    database_url: str
    counts: set[int] = field(default_factory=set)  # events per run seen by L1 and L2 clients
    queued_counts: set[int] = field(default_factory=set)  # by L3 clients
    commits: dict[int, list[int]] = field(default_factory=dict)  # of L1 runs, by concurrency
    firsts: dict[str, list[float]] = field(default_factory=dict)  # to the first event, by rung
    tokens: dict[str, list[float]] = field(default_factory=dict)  # to the first token, by rung
    concurrency: int = 1

    async def l0(self) -> float:
        """One engine run; its seconds."""
        _, token, total = await self.eng.run()
        self._token("L0", token)
        return total

    async def l1(self) -> float:
        """One run with its events committed, in this process; its seconds."""
        started = time.perf_counter()
        token = 0.0

        def delivered(_first: int, batch: list[str]) -> None:
            nonlocal token
            if not token and any(re.search(DELTA, event) for event in batch):
                token = time.perf_counter() - started

        events, commits = await durable_run(self.durable_eng, self.pool, delivered)
        self.counts.add(events)
        self.commits.setdefault(self.concurrency, []).append(commits)
        self._token("L1", token)
        return time.perf_counter() - started

    async def l2(self) -> float:
        """One run POSTed to the floor server and read to its terminal event; its seconds."""
        return await self._floor_run("L2", self.floor_ep, self.counts)

    async def l3(self) -> float:
        """One run POSTed to L3's server, run by its worker, read to its end; its seconds."""
        return await self._floor_run("L3", self.queued_ep, self.queued_counts)

    async def _floor_run(self, rung: str, ep: Endpoint, counts: set[int]) -> float:
        started = time.perf_counter()
        watch = _FirstToken(DELTA.encode())
        times = await floor_run(ep, rung, watch)
        counts.add(times.events)
        self._first(rung, times.first_event - started)
        self._token(rung, watch.at - started)
        return float(times.end - started)

    async def l4(self, conversation: str) -> float:
        """One agentrt run, as `bench.overhead.agentrt_run` streams it; its seconds."""
        started = time.perf_counter()
        watch = _FirstToken(re.escape(b"event: message.item.delta\n"))
        times = await sse(
            self.agentrt_ep,
            f"/api/conversations/{conversation}/messages?stream=true",
            method="POST",
            payload={"content": "go", "model": "scripted:bench"},
            on_frames=watch,
        )
        if times.terminal != "run.completed":
            raise RuntimeError(f"an agentrt run ended {times.terminal or 'without an end'}")
        self._first("L4", times.first_event - started)
        self._token("L4", watch.at - started)
        return float(times.end - started)

    def _first(self, rung: str, seconds: float) -> None:
        """Note the time to a run's first event (the POST to its first SSE frame), one at a time."""
        if self.concurrency == 1:
            self.firsts.setdefault(rung, []).append(seconds)

    def _token(self, rung: str, seconds: float) -> None:
        """Note the time to a run's first token (its answer's first piece), one at a time."""
        if self.concurrency == 1:
            if seconds <= 0:
                raise RuntimeError(f"an {rung} run streamed no token")
            self.tokens.setdefault(rung, []).append(seconds)

    async def sample(self, rung: str, runs: int, concurrency: int) -> Sample:
        """One batch of `rung`; agentrt's conversations are made before the timing starts."""
        url, self.concurrency = self.database_url, concurrency
        if rung == "L0":
            return await batch(self.l0, runs, concurrency, time.process_time, url)
        if rung == "L1":
            return await batch(self.l1, runs, concurrency, time.process_time, url)
        if rung == "L2":
            return await batch(self.l2, runs, concurrency, self.floor_proc.cpu_seconds, url)
        if rung == "L3":
            queued = self.queued_procs
            return await batch(
                self.l3, runs, concurrency, lambda: sum(p.cpu_seconds() for p in queued), url
            )
        convs = iter(await conversations(self.agentrt_ep, runs))
        procs = self.agentrt_procs
        return await batch(
            lambda: self.l4(next(convs)),
            runs,
            concurrency,
            lambda: sum(p.cpu_seconds() for p in procs),
            url,
        )


async def measure(
    database_url: str,
    procs: list[Proc],
    floor_procs: list[Proc],
    runs: dict[int, int],
    repeats: int,
) -> Series:
    """Run the five rungs back to back at each concurrency, `repeats` times.

    `floor_procs`: L2's server, L3's server, L3's worker.
    """
    series = Series()
    floor_proc, queued_proc = floor_procs[0], floor_procs[1]
    assert procs[0].url and floor_proc.url and queued_proc.url
    async with (
        engine(database_url) as eng,
        engine(database_url, saver=InlinePostgresSaver) as durable_eng,
        event_pool(database_url) as pool,
    ):
        eng.durability = durable_eng.durability = "sync"
        rungs = Rungs(
            eng,
            durable_eng,
            pool,
            Endpoint.of(floor_proc.url),
            floor_proc,
            Endpoint.of(queued_proc.url),
            floor_procs[1:],
            Endpoint.of(procs[0].url),
            procs,
            database_url,
        )
        for rung in RUNGS:  # warm up every path: imports, pools, caches
            await rungs.sample(rung, 10, 2)
        series.idle = await idle_cpu(database_url, procs)
        series.round_trip = await round_trip(rungs.floor_ep)
        for _ in range(repeats):
            for c in LEVELS:
                for rung in RUNGS:
                    series.loads.append(os.getloadavg()[0])
                    series.samples[rung][c].append(await rungs.sample(rung, runs[c], c))
        series.logged = await check_log(pool, rungs.counts, rungs.queued_counts)
        series.commits = {c: statistics.median(rungs.commits[c]) for c in LEVELS}
        series.firsts = rungs.firsts
        series.tokens = rungs.tokens
    return series


async def round_trip(ep: Endpoint, count: int = 50) -> float:
    """The median seconds of a `GET /readyz` of the floor server: an HTTP round trip."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await request(ep, "GET", "/readyz")
        times.append(time.perf_counter() - started)
    return float(statistics.median(times))


async def idle_cpu(database_url: str, procs: list[Proc], seconds: float = 5) -> tuple[float, float]:
    """CPU seconds per second that Postgres and agentrt's processes use with no run at all.

    Every process stays up throughout, so this background is in every rung's figures.
    """
    pg0, ours0 = postgres_cpu_seconds(database_url), sum(p.cpu_seconds() for p in procs)
    await asyncio.sleep(seconds)
    pg = (postgres_cpu_seconds(database_url) - pg0) / seconds
    return pg, (sum(p.cpu_seconds() for p in procs) - ours0) / seconds


async def check_log(
    pool: Pool, counts: set[int], queued_counts: set[int]
) -> tuple[int, int, int, int]:
    """Check that every floor run's log is gapless and complete, and each L3 tool ran once.

    Returns L1 and L2 runs and events per run, then L3's (one event more: `run.started`).
    A floor that lost or reordered events, or ran a tool twice, would be cheaper than the
    guarantees it stands for.
    """
    found = []
    async with pool.connection() as conn:
        for queued, seen in ((False, counts), (True, queued_counts)):
            cur = await conn.execute(
                "SELECT count(*) AS runs, count(*) FILTER (WHERE n <> top OR low <> 1) AS gapped,"
                " min(n) AS least, max(n) AS most FROM (SELECT count(*) AS n, max(seq) AS top,"
                " min(seq) AS low FROM floor_events e GROUP BY run_id"
                " HAVING EXISTS (SELECT 1 FROM floor_runs r WHERE r.id = e.run_id) = %s) AS x",
                (queued,),
            )
            row = await cur.fetchone()
            assert row is not None
            if row["gapped"] or row["least"] != row["most"] or seen != {row["most"]}:
                raise RuntimeError(
                    f"a floor's event log is not gapless and complete: {row}, {seen}"
                )
            found += [int(row["runs"]), int(row["most"])]
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM floor_runs WHERE status <> 'completed') AS open,"
            " (SELECT count(*) FROM floor_runs) AS runs,"
            " (SELECT count(*) FROM floor_tool_calls WHERE result IS NOT NULL) AS calls"
        )
        row = await cur.fetchone()
    assert row is not None
    if row["open"] or row["calls"] != row["runs"] or row["runs"] != found[2]:
        raise RuntimeError(f"L3's runs did not all complete with one tool call each: {row}")
    return found[0], found[1], found[2], found[3]


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
    repeats = 1 if quick else 5
    procs = start_stack(env, workers=1, concurrency=32)
    with processes(procs):
        floor_procs = [
            start_floor_server(database_url),
            start_floor_server(database_url, queued=True),
            start_floor_worker(database_url),
        ]
        with processes(floor_procs):
            series = run_async(measure(database_url, procs, floor_procs, runs, repeats))

    figures.add(RUNG_TEXT)
    figures.add("")
    figures.add(
        f"{repeats} repeat(s); in each, the five rungs run back to back at concurrency 1 "
        f"({runs[1]} runs each), then at concurrency 8 ({runs[8]} runs each); every process "
        "stays up throughout, on one embedded Postgres (pools of up to 20 connections). "
        "Latencies are pooled over the repeats; runs/s and CPU are medians over the repeats, "
        "and against L0 or the rung before they are paired within each repeat (medians of the "
        "per-repeat differences and ratios), so the steps need not add up. "
        "Python CPU is the benchmark process's for L0 and L1, the floor server's for L2, "
        "server + worker for L3, API + worker for L4; Postgres CPU is the whole server's. "
        f"Checked after the runs: all {series.logged[0]} L1 and L2 runs hold exactly "
        f"{series.logged[1]} events each in `floor_events`, and all {series.logged[2]} L3 runs "
        f"{series.logged[3]}, seq 1 to the last without a gap; every L2 and L3 client read "
        "them all; every L3 run completed, its tool run once. "
        f"With no run at all, Postgres used {series.idle[0] * 1000:.1f} ms of CPU per second "
        f"and agentrt's idle processes {series.idle[1] * 1000:.1f} ms per second (measured over "
        "5 s after the warm-up); that background is in every rung's figures. An L1 run's "
        f"{series.logged[1]} events took a median of {series.commits[1]:g} commits at "
        f"concurrency 1 and {series.commits[8]:g} at concurrency 8. The first token is the "
        "answer's first non-empty piece: for L0 as the engine streams it, for L1 once its batch "
        "is committed, for L2 to L4 once its frame reaches the client. The machine's load "
        f"average (1 min) while it ran: {min(series.loads):.2f} to {max(series.loads):.2f}; "
        "this benchmark's own processes make up to about 2 of it, the rest is other work."
    )
    figures.add("")
    for line in tables(series):
        figures.add(line)
    figures.add("")
    figures.add(
        "Against the targets of the runtime-overhead section, the floors first (L2: the stream "
        "guarantee; L3: all of agentrt's guarantees):"
    )
    figures.add("")
    for line in verdicts(series):
        figures.add(line)
    return figures
