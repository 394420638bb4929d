"""Fan-out: 100 SSE clients on one running run; delta latency to each client, CPU per client.

The run streams a scripted answer at about 200 chunks/s (5 ms between chunks). Latency is
from an event's `ts` (stamped when the worker stores it) to the moment a client has read
it; only events stored after the client connected count. Baseline: the same run with one
client, in the same benchmark. Two topologies, alternating in every repeat: all 100 clients
on one API process, and 50 on each of two API processes (each process follows the run's log
on its own; they share only Postgres).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.client import Endpoint, StreamTimes, request, sse
from bench.common import (
    Figures,
    Proc,
    env_for,
    postgres_cpu_seconds,
    processes,
    quantiles,
    run_async,
    start_api,
    start_stack,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT, TOOL_TURN
from bench.overhead import conversations

TS = b'"ts":"'


class Latencies:
    """Collect delta latencies of one client from raw SSE frames."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.connected = 0.0

    def on_frames(self, _now: float, frames: bytes) -> None:
        """Record the arrival time of each frame in `frames`."""
        now = time.time()
        if not self.connected:
            self.connected = now
        at = 0
        while (at := frames.find(b"event: message.item.delta\n", at)) >= 0:
            start = frames.index(TS, at) + len(TS)
            stamp = datetime.fromisoformat(frames[start : start + 27].decode()).timestamp()
            if stamp >= self.connected:
                self.values.append(now - stamp)
            at = start


@dataclass
class Round:
    """One run followed by its clients: latencies, API and Postgres CPU seconds, wall seconds."""

    latencies: list[float]
    api_cpu: float
    pg_cpu: float
    wall: float


async def one_round(
    apis: list[tuple[Endpoint, Proc]], clients: int, model: str, database_url: str
) -> Round:
    """Start a run, attach `clients` streams spread evenly over `apis`; return the round."""
    first = apis[0][0]
    conv = (await conversations(first, 1))[0]
    cpu0 = sum(p.cpu_seconds() for _, p in apis)
    pg0 = postgres_cpu_seconds(database_url)
    started = time.perf_counter()
    run = await request(
        first, "POST", f"/api/conversations/{conv}/messages", {"content": "go", "model": model}
    )
    collectors = [Latencies() for _ in range(clients)]
    async with asyncio.timeout(300):
        ends: list[StreamTimes] = await asyncio.gather(
            *(
                sse(
                    apis[n % len(apis)][0],
                    f"/api/runs/{run['runId']}/events",
                    on_frames=c.on_frames,
                )
                for n, c in enumerate(collectors)
            )
        )
    wall = time.perf_counter() - started
    assert all(e.terminal == "run.completed" for e in ends)
    return Round(
        [v for c in collectors for v in c.values],
        sum(p.cpu_seconds() for _, p in apis) - cpu0,
        postgres_cpu_seconds(database_url) - pg0,
        wall,
    )


TOPOLOGIES = ("1 client", "100 clients, 1 API", "100 clients, 2 APIs (50 + 50)")


async def measure(
    apis: list[tuple[Endpoint, Proc]], clients: int, repeats: int, database_url: str
) -> dict[str, list[Round]]:
    """Follow one run per topology and repeat, alternating the topologies."""
    for ep, _ in apis:
        for conv in await conversations(ep, 3):  # warm up both processes
            run = await request(
                ep,
                "POST",
                f"/api/conversations/{conv}/messages",
                {"content": "go", "model": "scripted:bench"},
            )
            await sse(ep, f"/api/runs/{run['runId']}/events")
    plans = {TOPOLOGIES[0]: (apis[:1], 1), TOPOLOGIES[1]: (apis[:1], clients)}
    plans[TOPOLOGIES[2]] = (apis, clients)
    found: dict[str, list[Round]] = {name: [] for name in plans}
    for _ in range(repeats):
        for name, (where, n) in plans.items():
            found[name].append(await one_round(where, n, "scripted:fan", database_url))
    return found


def main(database_url: str, quick: bool) -> Figures:
    """Measure how one run's stream fans out to many clients, on one and on two API processes."""
    figures = Figures("Fan-out to 100 SSE clients", "make bench (bench/fanout.py)")
    chunks = 400 if quick else 1000
    clients, repeats = 100, (1 if quick else 3)
    scripts = {
        "bench": AGENT_SCRIPT,
        "fan": [TOOL_TURN, {"text": "tick " * chunks, "chunk_chars": 5, "delay_s": 0.005}],
    }
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-fanout-"))
    env = env_for(database_url, scripted_models_file=str(write_scripts(folder, scripts)))
    procs = start_stack(env, workers=1)
    procs.append(start_api(env))
    apis = [(Endpoint.of(p.url), p) for p in (procs[0], procs[2]) if p.url is not None]
    with processes(procs):
        found = run_async(measure(apis, clients, repeats, database_url))
    figures.add(
        f"One run streaming {chunks} deltas at ~200/s; {repeats} repeat(s) of each topology, "
        "alternating: 1 client; 100 clients on one API process; 100 clients spread over two "
        "API processes (50 + 50). API processes run with `--no-workers`; one worker process."
    )
    figures.add("")
    figures.add(
        "| delta latency (event `ts` → client has read it) | " + " | ".join(TOPOLOGIES) + " |"
    )
    figures.add("|---|---|---|---|")
    q = {
        name: quantiles([v for r in rounds for v in r.latencies]) for name, rounds in found.items()
    }
    for key in ("p50", "p95", "p99"):
        base = q[TOPOLOGIES[0]][key]
        cells = [f"{base * 1000:.1f} ms"] + [
            f"{q[name][key] * 1000:.1f} ms ({q[name][key] / base:.1f}x)" for name in TOPOLOGIES[1:]
        ]
        figures.add(f"| {key} | " + " | ".join(cells) + " |")
    figures.add("")
    med = statistics.median
    api = {name: med(r.api_cpu / r.wall for r in rounds) for name, rounds in found.items()}
    pg = {name: med(r.pg_cpu / r.wall for r in rounds) for name, rounds in found.items()}
    figures.add("| CPU while streaming (share of a core) | " + " | ".join(TOPOLOGIES) + " |")
    figures.add("|---|---|---|---|")
    figures.add(
        "| API process(es) | " + " | ".join(f"{api[n] * 100:.0f}%" for n in TOPOLOGIES) + " |"
    )
    figures.add("| Postgres | " + " | ".join(f"{pg[n] * 100:.0f}%" for n in TOPOLOGIES) + " |")
    per_client = {n: (api[n] - api[TOPOLOGIES[0]]) / (clients - 1) for n in TOPOLOGIES[1:]}
    cells = ["", *(f"{per_client[n] * 1000:.1f} ms" for n in TOPOLOGIES[1:])]
    figures.add("| API CPU per client per second of streaming | " + " | ".join(cells) + " |")
    delivered = {n: med(len(r.latencies) for r in found[n]) for n in TOPOLOGIES[1:]}
    cells = ["", *(f"{delivered[n] / clients:.0f}" for n in TOPOLOGIES[1:])]
    figures.add("| deltas delivered per client per round | " + " | ".join(cells) + " |")
    figures.add("")
    figures.add(
        "CPU per client is the API processes' CPU above the 1-client round's, divided by the "
        "99 extra clients (≈ µs per delta per client: "
        + ", ".join(f"{per_client[n] / 200 * 1e6:.0f} µs {n}" for n in TOPOLOGIES[1:])
        + "). With two API processes each follows the run's log once: Postgres serves two "
        "readers instead of one."
    )
    return figures
