"""Time to first event: from the POST of a message to the first SSE event at the client.

Also the time to the first token (`message.item.delta`), against the engine's time to its
first stream part and first token (bench/engine.py), and a loopback HTTP round trip
(`GET /healthz`) as the floor of any HTTP answer. Runs one at a time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench.client import Endpoint, request, sse
from bench.common import (
    Figures,
    database_url_for,
    env_for,
    met,
    processes,
    quantiles,
    run_async,
    start_api,
    start_stack,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT, engine
from bench.overhead import conversations

DELTA = b"event: message.item.delta\n"


async def one(ep: Endpoint, conversation: str, streamed: bool = True) -> tuple[float, float, float]:
    """Return seconds from the POST to the first event, the first delta, and the end.

    Streamed: the POST answers with the run's events (`?stream=true`); otherwise the client
    POSTs, then opens `GET /api/runs/{id}/events`.
    """
    first_delta = 0.0

    def on_frames(now: float, frames: bytes) -> None:
        nonlocal first_delta
        if not first_delta and DELTA in frames:
            first_delta = now

    started = time.perf_counter()
    path, body = (
        f"/api/conversations/{conversation}/messages",
        {"content": "go", "model": "scripted:bench"},
    )
    if streamed:
        times = await sse(
            ep, f"{path}?stream=true", method="POST", payload=body, on_frames=on_frames
        )
    else:
        run = await request(ep, "POST", path, body)
        times = await sse(ep, f"/api/runs/{run['runId']}/events", on_frames=on_frames)
    return times.first_event - started, first_delta - started, times.end - started


async def measure(
    database_url: str, ep: Endpoint, runs: int, repeats: int
) -> dict[str, list[float]]:
    """Stream runs and record when their first event and token arrive."""
    found: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        found.setdefault(key, []).append(value)

    async with engine(database_url) as eng:
        eng.durability = "sync"  # as agentrt's executor
        convs = await conversations(ep, 2 * runs * repeats + 5)
        spare = convs[5 + runs * repeats :]  # for the two-request flow
        for conv in convs[:5]:  # warm up
            await one(ep, conv)
            await eng.run()
        for repeat in range(repeats):
            rates = []
            for conv in convs[5 + repeat * runs : 5 + (repeat + 1) * runs]:
                started = time.perf_counter()
                await request(ep, "GET", "/healthz")
                add("healthz", time.perf_counter() - started)
                first, token, _ = await eng.run()
                add("engine first part", first)
                add("engine first token", token)
                first_event, first_delta, _end = await one(ep, conv)
                add("first event", first_event)
                add("first delta", first_delta)
                rates.append(first_event)
                two_event, two_delta, _end = await one(ep, spare.pop(), streamed=False)
                add("first event, two requests", two_event)
                add("first delta, two requests", two_delta)
            add("repeat p50", statistics.median(rates))
    return found


def main(database_url: str, quick: bool) -> Figures:
    """Measure time to the first event and the first token."""
    figures = Figures("Time to first event", "make bench (bench/first_event.py)")
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-first-"))
    env = env_for(
        database_url, scripted_models_file=str(write_scripts(folder, {"bench": AGENT_SCRIPT}))
    )
    runs, repeats = (30, 1) if quick else (100, 3)
    procs = start_stack(env, workers=1)
    assert procs[0].url is not None
    with processes(procs):
        found = run_async(measure(database_url, Endpoint.of(procs[0].url), runs, repeats))
    # The default deployment (`make run`): one process serves the API and runs the workers.
    one_url = database_url_for(database_url, "bench_first_event_one_process")
    api = start_api({**env, "DATABASE_URL": one_url}, workers=True)
    assert api.url is not None
    with processes([api]):
        one = run_async(measure(one_url, Endpoint.of(api.url), runs, 1))
    q = {k: quantiles(v) for k, v in found.items()}
    ms = 1000
    figures.add(
        f"One run at a time, {repeats} x {runs} runs; the engine and a `GET /healthz` round trip "
        "are measured just before each agentrt run. A run is one request (the message POSTed "
        "with `?stream=true`); the same run with two requests (POST, then GET of the stream) "
        "is measured right after it."
    )
    figures.add("")
    figures.add("| from the start to | p50 | p95 | baseline p50 | ratio | target |")
    figures.add("|---|---|---|---|---|---|")
    fe, hz = q["first event"], q["healthz"]
    figures.add(
        f"| first SSE event (POST → `run.created` at the client) | {fe['p50'] * ms:.1f} ms | "
        f"{fe['p95'] * ms:.1f} ms | HTTP round trip {hz['p50'] * ms:.1f} ms | "
        f"{fe['p50'] / hz['p50']:.1f}x | p50 ≤ 5 ms {met(fe['p50'] <= 0.005)} |"
    )
    f2, d2 = q["first event, two requests"], q["first delta, two requests"]
    figures.add(
        f"| first SSE event with two requests (POST, then GET) | {f2['p50'] * ms:.1f} ms | "
        f"{f2['p95'] * ms:.1f} ms | HTTP round trip {hz['p50'] * ms:.1f} ms | "
        f"{f2['p50'] / hz['p50']:.1f}x | context |"
    )
    ep_, fd, et = q["engine first part"], q["first delta"], q["engine first token"]
    figures.add(
        f"| first SSE event, against the engine's first stream part | {fe['p50'] * ms:.1f} ms | "
        f"{fe['p95'] * ms:.1f} ms | engine {ep_['p50'] * ms:.1f} ms | "
        f"{fe['p50'] / ep_['p50']:.1f}x | |"
    )
    figures.add(
        f"| first token (`message.item.delta`) | {fd['p50'] * ms:.1f} ms | {fd['p95'] * ms:.1f} ms"
        f" | engine {et['p50'] * ms:.1f} ms | {fd['p50'] / et['p50']:.2f}x"
        f" | ≤ 1.5x {met(fd['p50'] <= 1.5 * et['p50'])} |"
    )
    figures.add(
        f"| first token with two requests | {d2['p50'] * ms:.1f} ms | {d2['p95'] * ms:.1f} ms"
        f" | engine {et['p50'] * ms:.1f} ms | {d2['p50'] / et['p50']:.2f}x | context |"
    )
    o = {k: quantiles(v) for k, v in one.items()}
    oe, od, oet = o["first event"], o["first delta"], o["engine first token"]
    figures.add(
        f"| first SSE event, one process (`agentrt serve` with its workers, as `make run`; "
        f"n={runs}) | {oe['p50'] * ms:.1f} ms | {oe['p95'] * ms:.1f} ms | HTTP round trip "
        f"{o['healthz']['p50'] * ms:.1f} ms | {oe['p50'] / o['healthz']['p50']:.1f}x | "
        f"p50 ≤ 5 ms {met(oe['p50'] <= 0.005)} |"
    )
    figures.add(
        f"| first token, one process | {od['p50'] * ms:.1f} ms | {od['p95'] * ms:.1f} ms"
        f" | engine {oet['p50'] * ms:.1f} ms | {od['p50'] / oet['p50']:.2f}x"
        f" | ≤ 1.5x {met(od['p50'] <= 1.5 * oet['p50'])} |"
    )
    spread = found["repeat p50"]
    figures.add("")
    figures.add(
        "Median of each repeat's p50 (first event): "
        + ", ".join(f"{v * ms:.1f} ms" for v in spread)
        + "."
    )
    return figures
