"""The cost of storing each step's checkpoint before the next step starts (`durability="sync"`).

agentrt's executor streams the graph with `durability="sync"`, so that no tool runs for a model
turn that is not checkpointed. This measures what that costs against LangGraph's default
`"async"` (checkpoints written in the background): the engine floor's agent graph (one
calculator call, then a 20-chunk answer) in this process, the two modes interleaved in every
repeat so that a busy machine weighs on both alike.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.common import Figures, run_async, stat_line
from bench.engine import engine

MODES = ("async", "sync")


async def measure(database_url: str, quick: bool) -> dict[str, dict[str, list[float]]]:
    """Time runs in each durability mode and return the samples."""
    repeats, sequential, batch = (3, 10, 40) if quick else (5, 30, 200)
    found: dict[str, dict[str, list[float]]] = {
        m: {"latency": [], "rate8": [], "rate32": []} for m in MODES
    }
    async with engine(database_url) as eng:
        for _ in range(repeats):
            for mode in MODES:
                eng.durability = mode  # type: ignore[assignment]
                for _ in range(sequential):
                    found[mode]["latency"].append((await eng.run())[2])
                found[mode]["rate8"].append((await eng.throughput(batch, 8))[1])
                found[mode]["rate32"].append((await eng.throughput(batch, 32))[1])
    return found


def main(database_url: str, quick: bool) -> Figures:
    """Compare run latency with synchronous and asynchronous checkpoints."""
    found: Any = run_async(measure(database_url, quick))
    figures = Figures(
        'Checkpoint durability ("sync" against "async")',
        f"python -m bench.run {'--quick ' if quick else ''}--only durability",
    )
    figures.add("| mode | latency, one run at a time | runs/s at 8 | runs/s at 32 |")
    figures.add("|---|---|---|---|")
    for mode in MODES:
        f = found[mode]
        figures.add(
            f"| {mode} | {stat_line(f['latency'])} | {statistics.median(f['rate8']):.1f} "
            f"| {statistics.median(f['rate32']):.1f} |"
        )
    slower = statistics.median(found["sync"]["latency"]) / statistics.median(
        found["async"]["latency"]
    )
    figures.add("")
    figures.add(
        f"One run at a time, sync takes {slower:.2f}x the median latency of async: each of the "
        "run's checkpoint writes (one per step) is waited for instead of overlapping the "
        "next step. Medians of interleaved repeats, in process, no HTTP or event log. "
        f"Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."
    )
    return figures
