"""Chaos: runs with a non-idempotent side effect while workers die or Postgres restarts.

`python -m bench.chaos [--quick] [--runs N] [--trial kill|postgres ...] [--write]`

Each trial has its own embedded Postgres, an API process and three worker processes. Every run
asks the model, charges an outside ledger (a file the run's transactions do not cover) through
a tool, then streams an answer. Meanwhile the `kill` trial sends `kill -9` to a random worker
every 1-4 s and starts a replacement; the `postgres` trial stops Postgres (fast shutdown)
every 4-9 s for 0.5-2 s. A few extra runs are cancelled mid-answer to time cancels under
chaos. At the end every run must have completed (or, if cancelled, be cancelled), charged
once, kept a gapless log with one terminal event, and stored an output equal to its deltas.
Exits 1 when any run broke a rule; `--write` puts the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.chaos_check import Verdict, check
from bench.common import (
    Figures,
    Proc,
    database_url_for,
    env_for,
    machine,
    start_api,
    start_worker,
    start_workers,
    write_scripts,
)

ANSWER = "paid " * 30
EXPECTED = "Charging.\n\n" + ANSWER
TRIALS = ("kill", "postgres")
WORKERS = 3
START_S = 300  # a process may take minutes to start on a loaded machine


def scripts(ledger: Path) -> dict[str, list[dict[str, Any]]]:
    """The chaos model: a charge under a fresh call id (as providers do), then a streamed answer."""
    charge = {"name": "charge", "args": {"path": str(ledger), "hold_s": 0.3}, "id": "fresh"}
    return {
        "chaos": [
            {"text": "Charging.", "tool_calls": [charge]},
            {"text": ANSWER, "chunk_chars": 5, "delay_s": 0.03},
        ],
        "long": [{"text": "wait " * 600, "chunk_chars": 5, "delay_s": 0.02}],
    }


@dataclass
class Trial:
    """One trial's figures, with the verdict of the checks."""

    kind: str
    verdict: Verdict
    faults: int
    cancel_latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0


class Postgres:
    """An embedded Postgres in a folder of its own, which can be stopped and started again."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="agentrt-chaos-"))
        self.url = self.start()

    def start(self) -> str:
        """Start the database server and return its URL."""
        warnings.simplefilter("ignore")
        import pgserver  # type: ignore[import-untyped]

        return str(pgserver.get_server(self.folder / "pg", cleanup_mode="stop").get_uri())

    def stop(self) -> None:
        """Stop the database server."""
        import pgserver

        pgserver.get_server(self.folder / "pg", cleanup_mode="stop").cleanup()

    def remove(self) -> None:
        """Delete the database's data directory."""
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


async def retrying(call: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
    """Send a request until the server answers it below 500 (it may be mid-restart)."""
    while True:
        with contextlib.suppress(httpx.HTTPError):
            response = await call()
            if response.status_code < 500:
                return response
        await asyncio.sleep(0.2)


async def post_run(client: httpx.AsyncClient, model: str) -> str:
    """Post one message and return the id of the run it starts."""
    conv = await retrying(lambda: client.post("/api/conversations", json={}))
    body = {"content": "go", "model": f"scripted:{model}"}
    path = f"/api/conversations/{conv.json()['conversationId']}/messages"
    response = await retrying(lambda: client.post(path, json=body))
    response.raise_for_status()
    return str(response.json()["runId"])


async def until_ended(client: httpx.AsyncClient, run_id: str) -> str:
    """Poll a run until it reaches a terminal status and return that status."""
    while True:
        response = await retrying(lambda: client.get(f"/api/runs/{run_id}"))
        status = str(response.json()["status"])
        if status in ("completed", "failed", "cancelled"):
            return status
        await asyncio.sleep(0.2)


async def cancel_one(client: httpx.AsyncClient, run_id: str, asked: dict[str, float]) -> None:
    """Cancel the run once its answer streams; note when the cancel was accepted."""
    while True:
        snap = (await retrying(lambda: client.get(f"/api/runs/{run_id}/snapshot"))).json()
        if snap["items"] and len(snap["items"][-1]["text"]) > 50:
            break
        await asyncio.sleep(0.1)
    sent = time.time()
    await retrying(lambda: client.post(f"/api/runs/{run_id}/cancel"))
    asked[run_id] = sent
    await until_ended(client, run_id)


async def kill_workers(env: dict[str, str], workers: list[Proc], stop: asyncio.Event) -> int:
    """`kill -9` a random worker every 1-4 s and start a replacement; return the kills.

    One worker always stays up, so that recovery times measure the runtime, not how long
    a new process takes to start on a loaded machine.
    """
    kills = 0
    starting: set[asyncio.Task[None]] = set()

    async def replace() -> None:
        workers.append(await asyncio.to_thread(start_worker, env, 4, START_S))

    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), random.uniform(1, 4))
            break
        if len(workers) < 2:
            continue
        victim = workers.pop(random.randrange(len(workers)))
        victim.kill()
        await asyncio.to_thread(victim.popen.wait)
        kills += 1
        task = asyncio.create_task(replace())
        starting.add(task)
        task.add_done_callback(starting.discard)
    await asyncio.gather(*starting, return_exceptions=True)
    return kills


async def restart_postgres(pg: Postgres, stop: asyncio.Event) -> int:
    """Stop Postgres every 4-9 s for 0.5-2 s; return the restarts."""
    restarts = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), random.uniform(4, 9))
            break
        await asyncio.to_thread(pg.stop)
        await asyncio.sleep(random.uniform(0.5, 2))
        await asyncio.to_thread(pg.start)
        restarts += 1
    return restarts


async def trial(kind: str, runs: int, cancels: int, concurrency: int) -> Trial:
    """Run one trial and check it."""
    began = time.monotonic()
    pg = Postgres()
    procs: list[Proc] = []
    workers: list[Proc] = []
    try:
        url = await asyncio.to_thread(database_url_for, pg.url, "chaos")
        ledger = pg.folder / "ledger"
        env = env_for(
            url,
            scripted_models_file=str(write_scripts(pg.folder, scripts(ledger))),
            tool_modules=["bench.chaos_tools:charge"],
            lease_seconds=3.0,
            worker_poll_seconds=0.5,
            max_recoveries=100,  # the chaos is the point: no run may be dead-lettered by it
        )
        api = await asyncio.to_thread(start_api, env, limit_s=START_S)
        procs.append(api)
        workers.extend(await asyncio.to_thread(start_workers, env, WORKERS, 4, START_S))
        stop = asyncio.Event()
        chaos = asyncio.create_task(
            kill_workers(env, workers, stop) if kind == "kill" else restart_postgres(pg, stop)
        )
        asked: dict[str, float] = {}
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=api.url or "", timeout=30) as client:

            async def one(model: str) -> None:
                async with gate:
                    run_id = await post_run(client, model)
                    if model == "long":
                        await cancel_one(client, run_id, asked)
                    else:
                        await until_ended(client, run_id)

            models = ["chaos"] * runs + ["long"] * cancels
            random.shuffle(models)
            async with asyncio.timeout(120 + runs * 10):
                await asyncio.gather(*(one(m) for m in models))
            stop.set()
            faults = await chaos
        verdict = await asyncio.to_thread(check, url, ledger, EXPECTED, set(asked))
        latencies = await asyncio.to_thread(_cancel_latencies, url, asked)
        return Trial(kind, verdict, faults, latencies, time.monotonic() - began)
    finally:
        for proc in procs + workers:
            proc.kill(signal.SIGKILL)
        pg.remove()


def _cancel_latencies(url: str, asked: dict[str, float]) -> list[float]:
    """Seconds from an accepted cancel request to the stored `run.cancelled`."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT run_id, ts FROM run_events WHERE type = 'run.cancelled' AND run_id = ANY(%s)",
            (list(asked),),
        ).fetchall()
    return [ts.timestamp() - asked[run_id] for run_id, ts in rows]


def _p50_max(values: list[float]) -> str:
    if not values:
        return "none"
    return f"p50 {statistics.median(values):.2f} s, max {max(values):.2f} s (n={len(values)})"


def report(t: Trial, command: str) -> Figures:
    """One trial's figures as a docs/benchmarks.md section."""
    title = "kill -9 of workers" if t.kind == "kill" else "Postgres restarts"
    figures = Figures(f"Chaos: {title}", command)
    v = t.verdict
    faults = f"{t.faults} {'kill -9' if t.kind == 'kill' else 'restarts'}"
    figures.add(
        "| runs | faults | completed | cancelled | not charged once | bad outputs "
        "| log defects | recovery | cancel latency | time |"
    )
    figures.add("|---|---|---|---|---|---|---|---|---|---|")
    figures.add(
        f"| {v.runs} | {faults} | {v.completed} | {v.cancelled} | {v.duplicate_charges} "
        f"| {v.bad_outputs} | {v.log_defects} | {_p50_max(v.recoveries)} "
        f"| {_p50_max(t.cancel_latencies)} | {t.seconds:.0f} s |"
    )
    figures.add("")
    figures.add(
        "Recovery: from the last event a dead attempt stored to the next attempt's "
        "`run.started` (the lease, 3 s here, must expire first; with Postgres down it includes "
        "the outage). Cancel latency: from the accepted `POST /cancel` to the stored "
        "`run.cancelled`, under the same chaos. Every run is checked: completed, charged once "
        "in the outside ledger, a gapless log with one terminal event whose `usage` stubs all "
        "have their ledger rows and whose `run.completed` stub its message, and the stored "
        "output equal to the deltas and to the "
        "snapshot, with no repeated item. Load average at the "
        f"end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the chaos trials and print their figures; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="12 runs per trial")
    parser.add_argument("--runs", type=int, help="runs per trial (default 100, quick 12)")
    parser.add_argument("--trial", nargs="*", choices=TRIALS, default=list(TRIALS))
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args(argv)
    runs = args.runs or (12 if args.quick else 100)
    cancels = 2 if args.quick else 10
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}", flush=True)
    trials = []
    for kind in args.trial:
        print(f"\n== {kind}: {runs} runs, {cancels} cancels", flush=True)
        trials.append(asyncio.run(trial(kind, runs, cancels, concurrency=8)))
        for problem in trials[-1].verdict.problems[:20]:
            print(f"  PROBLEM {problem}", flush=True)
    command = "make chaos" if not args.quick and not args.runs else " ".join(sys.argv)
    command = command.replace(sys.argv[0], "python -m bench.chaos")
    for t in trials:
        figures = report(t, command)
        if args.write:
            from bench.run import write_section

            stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}"
            write_section(figures, stamp, args.quick)
    return 0 if all(t.verdict.ok for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
