"""What a longer answer costs: CPU per streamed piece, agentrt against the engine.

The run of the other benchmarks (a tool call, then an answer) is run with an answer of
`SHORT` pieces and of `LONG` pieces of 5 characters, one run at a time, agentrt (an API
process and a worker process) and the engine (bench/engine.py, `durability="sync"`) in
turns. The difference between the two lengths, divided by the pieces added, is what a piece
costs each process; the engine's is what LangGraph and the model's stream cost anyway. Also
counted: the events a long answer leaves in the run's log.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.client import Endpoint, sse
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
from bench.engine import TOOL_TURN, engine
from bench.overhead import conversations

SHORT, LONG = 20, 500


def script(pieces: int) -> list[dict[str, Any]]:
    """The benchmark's run with an answer of `pieces` pieces of 5 characters."""
    return [TOOL_TURN, {"text": "word " * pieces, "chunk_chars": 5}]


@dataclass
class Cost:
    """CPU per run in ms: by process (agentrt: API, worker) and Postgres's."""

    python: dict[str, float]
    postgres: float


def per_piece(short: Cost, long: Cost, added: int = LONG - SHORT) -> dict[str, float]:
    """µs of CPU per piece added, by process and for Postgres, from two runs' costs."""
    found = {k: (long.python[k] - short.python[k]) / added * 1000 for k in short.python}
    found["Postgres"] = (long.postgres - short.postgres) / added * 1000
    return found


async def agentrt_cost(ep: Endpoint, procs: list[Proc], url: str, model: str, runs: int) -> Cost:
    """Stream `runs` runs of `model` one at a time; return the CPU each took."""
    convs = await conversations(ep, runs)
    before, pg = [p.cpu_seconds() for p in procs], postgres_cpu_seconds(url)
    for conv in convs:
        await sse(
            ep,
            f"/api/conversations/{conv}/messages?stream=true",
            method="POST",
            payload={"content": "go", "model": model},
        )
    after = [p.cpu_seconds() for p in procs]
    spent = [(b - a) / runs * 1000 for a, b in zip(before, after, strict=True)]
    return Cost(
        {"API": spent[0], "worker": sum(spent[1:])},
        (postgres_cpu_seconds(url) - pg) / runs * 1000,
    )


async def engine_cost(url: str, pieces: int, runs: int) -> Cost:
    """Run the engine `runs` times with an answer of `pieces` pieces; return its CPU per run."""
    async with engine(url, script(pieces)) as eng:
        eng.durability = "sync"  # as agentrt's executor
        for _ in range(5):
            await eng.run()
        cpu, pg = time.process_time(), postgres_cpu_seconds(url)
        for _ in range(runs):
            await eng.run()
        return Cost(
            {"engine": (time.process_time() - cpu) / runs * 1000},
            (postgres_cpu_seconds(url) - pg) / runs * 1000,
        )


async def measure(
    ep: Endpoint, procs: list[Proc], url: str, runs: int, rounds: int
) -> list[tuple[Cost, Cost, Cost, Cost]]:
    """Rounds of (agentrt short, agentrt long, engine short, engine long) costs."""
    await agentrt_cost(ep, procs, url, "scripted:short", 10)  # warm up
    await agentrt_cost(ep, procs, url, "scripted:long", 3)
    found = []
    for _ in range(rounds):
        found.append(
            (
                await agentrt_cost(ep, procs, url, "scripted:short", runs),
                await agentrt_cost(ep, procs, url, "scripted:long", runs // 2),
                await engine_cost(url, SHORT, runs),
                await engine_cost(url, LONG, runs // 2),
            )
        )
    return found


def log_events(url: str) -> float:
    """Events per run in the log of the runs of the long answer."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*)::float / count(DISTINCT e.run_id) FROM run_events e"
            " JOIN runs r ON r.id = e.run_id WHERE r.model = 'scripted:long'"
        ).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def main(database_url: str, quick: bool) -> Figures:
    """Measure the CPU a streamed piece costs agentrt and the engine."""
    figures = Figures("Cost of a longer answer", "make bench (bench/answer_length.py)")
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-length-"))
    scripts = {"short": script(SHORT), "long": script(LONG)}
    env = env_for(database_url, scripted_models_file=str(write_scripts(folder, scripts)))
    runs, rounds = (20, 1) if quick else (60, 3)
    procs = start_stack(env, workers=1)
    assert procs[0].url is not None
    with processes(procs):
        found = run_async(measure(Endpoint.of(procs[0].url), procs, database_url, runs, rounds))
    events = log_events(database_url)
    pieces = [(per_piece(a, b), per_piece(c, d)) for a, b, c, d in found]

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def span(values: list[float]) -> str:
        return f"{med(values):.1f} µs ({min(values):.1f} to {max(values):.1f})"

    ours = {k: [p[0][k] for p in pieces] for k in ("API", "worker", "Postgres")}
    theirs = {k: [p[1][k] for p in pieces] for k in ("engine", "Postgres")}
    extra = [
        p[0]["API"] + p[0]["worker"] + p[0]["Postgres"] - p[1]["engine"] - p[1]["Postgres"]
        for p in pieces
    ]
    long_ours = [b.python["API"] + b.python["worker"] + b.postgres for _, b, _, _ in found]
    long_theirs = [d.python["engine"] + d.postgres for _, _, _, d in found]
    figures.add(
        f"The run of the other benchmarks (a tool call, then an answer) with an answer of "
        f"{SHORT} and of {LONG} pieces of 5 characters, one run at a time; {rounds} round(s) "
        f"of {runs} short and {runs // 2} long runs, agentrt (one API process, one worker "
        "process) and the engine (in this process) in turns. CPU per piece: the difference "
        f"between the two lengths over the {LONG - SHORT} pieces added, median of the rounds "
        "(lowest to highest)."
    )
    figures.add("")
    figures.add("| CPU per piece added | agentrt | engine |")
    figures.add("|---|---|---|")
    figures.add(f"| API process | {span(ours['API'])} | |")
    figures.add(f"| worker process / engine | {span(ours['worker'])} | {span(theirs['engine'])} |")
    figures.add(f"| Postgres | {span(ours['Postgres'])} | {span(theirs['Postgres'])} |")
    figures.add(f"| agentrt beyond the engine | {span(extra)} | |")
    figures.add("")
    figures.add(
        f"A {LONG}-piece answer's run: {med(long_ours):.1f} ms of CPU in all for agentrt (API, "
        f"worker, Postgres) against {med(long_theirs):.1f} ms for the engine "
        f"({med(long_ours) - med(long_theirs):+.1f} ms); its log holds {events:.1f} events "
        f"(pieces sent together are one `message.item.delta`, docs/decisions/2024)."
    )
    return figures
