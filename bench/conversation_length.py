"""What a run costs as its conversation grows: one conversation's runs against fresh ones.

The run of the other benchmarks (a tool call, then an answer), one at a time, through an API
process and a worker process. One conversation takes every run of the "long" column, so its
history grows by one run's messages each time; the "fresh" column's runs each start a new
conversation. The two alternate in windows of `WINDOW` runs, so the machine's drift falls on
both. Per window: Postgres CPU, API and worker CPU, and latency p50 per run, and what the
long conversation's thread then stores of its `messages` channel (LangGraph's checkpoint
blobs: the channel's whole value at each version).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.client import Endpoint
from bench.common import (
    Figures,
    Proc,
    env_for,
    postgres_cpu_seconds,
    processes,
    run_async,
    start_stack,
    write_scripts,
)
from bench.engine import AGENT_SCRIPT
from bench.overhead import agentrt_run, conversations

WINDOW = 25


@dataclass
class Window:
    """One window's figures, per run: CPU in ms, latency p50 in ms."""

    runs_before: int
    postgres: float
    python: float
    latency: float


async def window(
    ep: Endpoint, procs: list[Proc], url: str, convs: list[str], before: int
) -> Window:
    """Run one run in each of `convs` (one at a time); return the window's figures."""
    cpu, pg = sum(p.cpu_seconds() for p in procs), postgres_cpu_seconds(url)
    latencies = [await agentrt_run(ep, conv) for conv in convs]
    n = len(convs)
    return Window(
        before,
        (postgres_cpu_seconds(url) - pg) / n * 1000,
        (sum(p.cpu_seconds() for p in procs) - cpu) / n * 1000,
        statistics.median(latencies) * 1000,
    )


async def measure(
    ep: Endpoint, procs: list[Proc], url: str, windows: int
) -> tuple[list[Window], list[Window], str]:
    """The long conversation's windows and the fresh ones', and the long conversation's id."""
    for conv in await conversations(ep, 5):  # warm up
        await agentrt_run(ep, conv)
    long = (await conversations(ep, 1))[0]
    fresh = await conversations(ep, windows * WINDOW)
    grown: list[Window] = []
    new: list[Window] = []
    for k in range(windows):
        started = time.perf_counter()
        grown.append(await window(ep, procs, url, [long] * WINDOW, k * WINDOW))
        new.append(await window(ep, procs, url, fresh[k * WINDOW : (k + 1) * WINDOW], 0))
        print(f"  window {k + 1}/{windows}: {time.perf_counter() - started:.0f} s", flush=True)
    return grown, new, long


def stored_messages(url: str, thread: str) -> tuple[int, float, float]:
    """The thread's `messages` blobs: how many, their mean and largest size in KiB."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*), avg(length(blob)), max(length(blob)) FROM checkpoint_blobs"
            " WHERE thread_id = %s AND channel = 'messages'",
            (thread,),
        ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1] or 0) / 1024, float(row[2] or 0) / 1024


def main(database_url: str, quick: bool) -> Figures:
    """Measure a run's cost against its conversation's length."""
    figures = Figures(
        "Cost against a conversation's length", "make bench (bench/conversation_length.py)"
    )
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-conversation-"))
    env = env_for(
        database_url, scripted_models_file=str(write_scripts(folder, {"bench": AGENT_SCRIPT}))
    )
    windows = 2 if quick else 8
    procs = start_stack(env, workers=1)
    assert procs[0].url is not None
    with processes(procs):
        grown, new, thread = run_async(
            measure(Endpoint.of(procs[0].url), procs, database_url, windows)
        )
    count, mean_kib, max_kib = stored_messages(database_url, thread)
    figures.add(
        "The run of the other benchmarks (a tool call, then an answer), one at a time, through"
        " one API process and one worker process. One conversation takes every run of the"
        f" long column; each run of the fresh column starts a conversation of its own. Windows"
        f" of {WINDOW} runs, long and fresh in turns; figures per run."
    )
    figures.add("")
    figures.add(
        "| runs before in the conversation | Postgres CPU | fresh | API + worker CPU | fresh"
        " | latency p50 | fresh |"
    )
    figures.add("|---|---|---|---|---|---|---|")
    for g, f in zip(grown, new, strict=True):
        figures.add(
            f"| {g.runs_before} | {g.postgres:.1f} ms | {f.postgres:.1f} ms"
            f" | {g.python:.1f} ms | {f.python:.1f} ms | {g.latency:.1f} ms | {f.latency:.1f} ms |"
        )
    first, last = grown[0], grown[-1]
    fresh_pg = statistics.median(w.postgres for w in new)
    figures.add("")
    figures.add(
        f"From the first window to the last ({last.runs_before} runs later), a run of the long"
        f" conversation costs Postgres {last.postgres / first.postgres:.1f}x and the API and"
        f" worker {last.python / first.python:.1f}x (a fresh conversation's run: Postgres"
        f" {fresh_pg:.1f} ms throughout). The long conversation's thread stores {count}"
        f" `messages` blobs, {mean_kib:.0f} KiB on average and {max_kib:.0f} KiB the largest:"
        " each checkpoint that changes the channel stores its whole value, the conversation"
        " so far."
    )
    return figures
