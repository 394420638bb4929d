"""Start-up: how long `agentrt --help`, a client command and a new worker take to be usable.

The client command is `agentrt runs list` against a port where nothing listens: it measures
the command's own start (imports, configuration) and one refused connection, not a server.
A worker is timed from process start to its "ready" line on an already migrated database,
the case of a replacement worker in a running cluster. The load average at the start is
printed, since on a shared machine it moves these figures more than any code change.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import Figures, env_for, free_port, met, stat_line

AGENTRT = str(Path(sys.executable).parent / "agentrt")


CPU: dict[str, list[float]] = {}


def _timed(argv: list[str], env: dict[str, str]) -> float:
    """Run `argv`; return its wall time and note its CPU time (less sensitive to load)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    CPU.setdefault(" ".join(argv[1:3]), []).append(cpu)
    return wall


def start_worker(env: dict[str, str], limit_s: float) -> subprocess.Popen[bytes]:
    """Start one worker and wait for its "ready" line (generous: a loaded machine is slow)."""
    popen = subprocess.Popen(
        [AGENTRT, "worker"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert popen.stdout is not None
    ready, lines = threading.Event(), []

    def read() -> None:
        assert popen.stdout is not None
        for raw in popen.stdout:  # reads on after "ready", so the pipe never fills
            lines.append(raw.decode(errors="replace"))
            if lines[-1].strip().endswith("ready"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(limit_s):
        popen.kill()
        raise RuntimeError("the worker did not become ready:\n" + "".join(lines)[-3000:])
    return popen


def stop(popen: subprocess.Popen[bytes]) -> None:
    """Stop a worker the way a deploy does."""
    popen.send_signal(signal.SIGTERM)
    popen.wait(120)


def main(database_url: str, quick: bool) -> Figures:
    """Time the commands; return the figures."""
    figures = Figures("Start-up", "python -m bench.run --only startup")
    env = env_for(database_url)
    repeats = 5 if quick else 20
    figures.add(f"- load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    _timed([AGENTRT, "--help"], env)  # warm the file cache once
    help_s = [_timed([AGENTRT, "--help"], env) for _ in range(repeats)]
    dead = f"http://127.0.0.1:{free_port()}"
    client_s = [_timed([AGENTRT, "runs", "list", "--url", dead], env) for _ in range(repeats)]
    stop(start_worker(env, limit_s=600))  # migrate first, as in a running cluster
    worker_s = []
    for _ in range(3 if quick else 5):
        began = time.monotonic()
        worker = start_worker(env, limit_s=600)
        worker_s.append(time.monotonic() - began)
        stop(worker)
    figures.add(f"- `agentrt --help`: {stat_line(help_s)}; CPU {stat_line(CPU['--help'])}")
    figures.add(
        f"- `agentrt runs list` (client command, no server): {stat_line(client_s)};"
        f" CPU {stat_line(CPU['runs list'])}"
    )
    figures.add(f"- `agentrt worker` until ready: {stat_line(worker_s, 's', 1)}")
    figures.add(
        f"- target: --help and client commands well under 0.5 s: "
        f"{met(max(sorted(help_s)[len(help_s) // 2], sorted(client_s)[len(client_s) // 2]) < 0.5)}"
    )
    return figures
