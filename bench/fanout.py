"""Fan-out: 100 SSE clients on one running run; delta latency to each client, CPU per client.

The run streams a scripted answer at about 200 chunks/s (5 ms between chunks). Latency is
from an event's `ts` (stamped when the worker stores it) to the moment a client has read
it; only events stored after the client connected count. Baseline: the same run with one
client, in the same benchmark.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.client import Endpoint, StreamTimes, request, sse
from bench.common import (
    Figures,
    Proc,
    env_for,
    processes,
    quantiles,
    run_async,
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


async def one_round(
    ep: Endpoint, clients: int, api: Proc, model: str
) -> tuple[list[float], float, float]:
    """Start a run, attach `clients` streams; return latencies, API CPU and wall seconds."""
    conv = (await conversations(ep, 1))[0]
    cpu0 = api.cpu_seconds()
    started = time.perf_counter()
    run = await request(
        ep, "POST", f"/api/conversations/{conv}/messages", {"content": "go", "model": model}
    )
    collectors = [Latencies() for _ in range(clients)]
    async with asyncio.timeout(300):
        ends: list[StreamTimes] = await asyncio.gather(
            *(
                sse(ep, f"/api/runs/{run['runId']}/events", on_frames=c.on_frames)
                for c in collectors
            )
        )
    wall = time.perf_counter() - started
    assert all(e.terminal == "run.completed" for e in ends)
    return [v for c in collectors for v in c.values], api.cpu_seconds() - cpu0, wall


async def measure(
    ep: Endpoint, api: Proc, clients: int, repeats: int
) -> dict[int, list[tuple[list[float], float, float]]]:
    """Follow one run with `clients` readers and record frame delays."""
    found: dict[int, list[tuple[list[float], float, float]]] = {1: [], clients: []}
    for conv in await conversations(ep, 3):
        run = await request(
            ep,
            "POST",
            f"/api/conversations/{conv}/messages",
            {"content": "go", "model": "scripted:bench"},
        )
        await sse(ep, f"/api/runs/{run['runId']}/events")
    for _ in range(repeats):
        for n in (1, clients):
            found[n].append(await one_round(ep, n, api, "scripted:fan"))
    return found


def main(database_url: str, quick: bool) -> Figures:
    """Measure how one run's stream fans out to many clients."""
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
    api = procs[0]
    assert api.url is not None
    with processes(procs):
        found = run_async(measure(Endpoint.of(api.url), api, clients, repeats))
    one = quantiles([v for lat, _, _ in found[1] for v in lat])
    many = quantiles([v for lat, _, _ in found[clients] for v in lat])
    cpu_one = statistics.median(c / w for _, c, w in found[1])
    cpu_many = statistics.median(c / w for _, c, w in found[clients])
    per_client = (cpu_many - cpu_one) / (clients - 1)
    delivered = statistics.median(len(lat) for lat, _, _ in found[clients])
    figures.add(
        f"One run streaming {chunks} deltas at ~200/s; {repeats} repeat(s) of 1 client then "
        f"{clients} clients. API process: one (`--no-workers`), one worker process."
    )
    figures.add("")
    figures.add(
        "| delta latency (event `ts` → client has read it) | 1 client | 100 clients | ratio |"
    )
    figures.add("|---|---|---|---|")
    for key in ("p50", "p95", "p99"):
        figures.add(
            f"| {key} | {one[key] * 1000:.1f} ms | {many[key] * 1000:.1f} ms | "
            f"{many[key] / one[key]:.1f}x |"
        )
    figures.add("")
    figures.add(
        f"API CPU while streaming: {cpu_one * 100:.0f}% of a core with 1 client, "
        f"{cpu_many * 100:.0f}% with {clients}: **{per_client * 1000:.1f} ms of CPU per client "
        f"per second** of streaming (≈ {per_client / 200 * 1e6:.0f} µs per delta per client). "
        f"Deltas delivered per round with {clients} clients: {delivered:,} "
        f"(= {delivered / clients:.0f} per client)."
    )
    return figures
