"""Shared pieces of the benchmarks: machine facts, an embedded Postgres, processes, stats."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg

from server import loops

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    """One line about this machine and the versions that matter."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = ", ".join(
        f"{p} {metadata.version(p)}"
        for p in ("langgraph", "langgraph-checkpoint-postgres", "psycopg", "fastapi", "uvicorn")
    )
    loop = "event loop: asyncio"
    if loops.resolve_loop("auto") == "uvloop":  # and uvicorn's httptools parser, beside it
        loop = (
            f"event loop: uvloop {metadata.version('uvloop')} (HTTP: httptools "
            f"{metadata.version('httptools')}) in every process, the engine's included"
        )
    return (
        f"{os.cpu_count()} cores, {mem:.0f} GiB, {platform.machine()}, "
        f"Python {platform.python_version()}, {versions}; {loop}"
    )


# Connections the benchmarks' server accepts. Postgres's default, 100, is too few for the
# workers section's floor (four worker processes with two pools each, its server's pool and
# agentrt's API's): a loaded machine, whose pools grow while connections are slow to come
# back, once met "too many clients" there.
MAX_CONNECTIONS = 300


@contextlib.contextmanager
def embedded_postgres() -> Iterator[str]:
    """Start a throw-away embedded Postgres; yield its URL."""
    warnings.simplefilter("ignore")
    import pgserver  # type: ignore[import-untyped]

    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-"))
    server = pgserver.get_server(folder / "pg", cleanup_mode="stop")
    # The setting takes a restart: stop the new server and start it again on its data.
    with psycopg.connect(str(server.get_uri()), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
    server.cleanup()
    server = pgserver.get_server(folder / "pg", cleanup_mode="stop")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(database_url: str, **settings: Any) -> dict[str, str]:
    """Environment for agentrt processes: the database plus `AGENTRT_*` settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env.update(DATABASE_URL=database_url, PYTHONUNBUFFERED="1", AGENTRT_LOG_LEVEL="WARNING")
    for key, value in settings.items():
        env[f"AGENTRT_{key.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return env


def write_scripts(folder: Path, scripts: Mapping[str, Sequence[Mapping[str, Any]]]) -> Path:
    """Write scripted-model turns to a file for `AGENTRT_SCRIPTED_MODELS_FILE`."""
    path = folder / "scripts.json"
    path.write_text(json.dumps(scripts))
    return path


@dataclass
class Proc:
    """A started agentrt process."""

    popen: subprocess.Popen[bytes]
    url: str | None = None
    log: Path | None = None

    def tail(self) -> str:
        """The end of the process's output, when it was captured."""
        return self.log.read_text(errors="replace")[-2000:] if self.log else ""

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Send `signum` to the process."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signum)

    def stop(self) -> None:
        """Stop the process gracefully and wait for it."""
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
            self.popen.wait(10)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (Linux /proc)."""
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def rss_mib(self) -> float:
        """Resident memory of the process (Linux /proc)."""
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0


def _spawn_api(env: dict[str, str], workers: bool) -> Proc:
    port = free_port()
    args = [sys.executable, "-m", "server.cli", "serve", "--port", str(port)]
    if not workers:
        args.append("--no-workers")
    fd, log = tempfile.mkstemp(prefix="agentrt-bench-api-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        popen = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Proc(popen, f"http://127.0.0.1:{port}", Path(log))


def _await_api(proc: Proc, limit_s: float = 60) -> Proc:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{proc.url}/readyz", timeout=1).status_code == 200:
                return proc
        if proc.popen.poll() is not None:
            raise RuntimeError(f"the API server exited at start:\n{proc.tail()}")
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"the API server did not become ready:\n{proc.tail()}")


def _spawn_worker(env: dict[str, str], concurrency: int, count_calls: bool = False) -> Proc:
    # bench/callcount.py runs the worker with its function calls counted.
    launcher = ["-m", "bench.callcount", "server.cli"] if count_calls else ["-m", "server.cli"]
    popen = subprocess.Popen(
        [sys.executable, *launcher, "worker", "--concurrency", str(concurrency)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    return Proc(popen)


def _await_worker(proc: Proc, limit_s: float = 60) -> Proc:
    stdout = proc.popen.stdout
    assert stdout is not None
    ready = threading.Event()

    def read() -> None:
        # Reads on after "ready", so that the worker never blocks on a full pipe.
        for raw in stdout:
            if raw.decode().strip().endswith("ready"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(limit_s):
        proc.kill()
        raise RuntimeError("the worker did not become ready (or exited at start)")
    return proc


def start_api(env: dict[str, str], *, workers: bool = False, limit_s: float = 60) -> Proc:
    """Start `agentrt serve` on a free port; wait until it answers /readyz."""
    return _await_api(_spawn_api(env, workers), limit_s)


def start_worker(env: dict[str, str], concurrency: int = 16, limit_s: float = 60) -> Proc:
    """Start `agentrt worker`; wait until it says it is ready."""
    return _await_worker(_spawn_worker(env, concurrency), limit_s)


def start_workers(
    env: dict[str, str],
    count: int,
    concurrency: int = 16,
    limit_s: float = 60,
    count_calls: bool = False,
) -> list[Proc]:
    """Start `count` worker processes side by side; wait until all are ready.

    With `count_calls`, each counts its function calls (bench/callcount.py; it needs
    `BENCH_CALLS_DIR` in `env`).
    """
    spawned = [_spawn_worker(env, concurrency, count_calls) for _ in range(count)]
    try:
        return [_await_worker(w, limit_s) for w in spawned]
    except BaseException:
        for p in spawned:
            p.kill()
        raise


def start_stack(env: dict[str, str], workers: int = 1, concurrency: int = 16) -> list[Proc]:
    """Start an API process and `workers` worker processes side by side; API first in the list."""
    api = _spawn_api(env, False)
    spawned = [_spawn_worker(env, concurrency) for _ in range(workers)]
    try:
        return [_await_api(api), *(_await_worker(w) for w in spawned)]
    except BaseException:
        for p in [api, *spawned]:
            p.kill()
        raise


def postgres_cpu_seconds(database_url: str) -> float:
    """CPU time used so far by the embedded Postgres: postmaster, reaped and live backends."""
    folder = Path(parse_qs(urlsplit(database_url).query)["host"][0])
    root = int((folder / "postmaster.pid").read_text().split()[0])
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == root:
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        elif ppid == root:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def database_url_for(database_url: str, name: str) -> str:
    """Create database `name` on the same server (dropping an old one); return its URL."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(database_url)
    return parts._replace(path=f"/{name}").geturl()


@contextlib.contextmanager
def processes(procs: list[Proc]) -> Iterator[list[Proc]]:
    """Stop every process at the end."""
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


async def post_run(client: httpx.AsyncClient, model: str) -> str:
    """Create a conversation and a run; return the run id."""
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": model}
    )
    response.raise_for_status()
    return str(response.json()["runId"])


async def follow_to_end(client: httpx.AsyncClient, run_id: str) -> str:
    """Read the run's SSE stream until its terminal event; return that event's type."""
    last = ""
    async with client.stream("GET", f"/api/runs/{run_id}/events") as response:
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                last = line[7:]
    return last


@dataclass
class Figures:
    """A benchmark's result: a markdown section and its headline numbers."""

    title: str
    command: str
    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        """Add one line of figures."""
        print(line, flush=True)
        self.lines.append(line)

    def markdown(self) -> str:
        """Render the figures as a Markdown block."""
        return "\n".join(
            [f"## {self.title}", "", f"Command: `{self.command}`", "", *self.lines, "", ""]
        )


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """Median, p95, p99 and spread (max - min) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "spread": 0.0}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {
        "p50": statistics.median(ordered),
        "p95": pick(0.95),
        "p99": pick(0.99),
        "spread": ordered[-1] - ordered[0],
    }


def stat_line(values: Sequence[float], unit: str = "ms", scale: float = 1000) -> str:
    """`p50 X, p95 Y, spread Z (n)` of `values` scaled to `unit`."""
    q = quantiles(values)
    return (
        f"p50 {q['p50'] * scale:.1f} {unit}, p95 {q['p95'] * scale:.1f} {unit}, "
        f"spread {q['spread'] * scale:.1f} {unit} (n={len(values)})"
    )


def trust(values: Sequence[float], limit: float = 0.25) -> str:
    """Say whether repeats agree: the spread (max - min) against the median."""
    if len(values) < 2:
        return "one repeat: no spread"
    median = statistics.median(values)
    rel = (max(values) - min(values)) / median if median else 0.0
    verdict = "too wide to trust" if rel > limit else "ok"
    return f"spread {rel:.0%} of the median over {len(values)} repeats: {verdict}"


def met(ok: bool) -> str:
    """The word for a target's outcome."""
    return "**met**" if ok else "**missed**"


@contextlib.asynccontextmanager
async def http(url: str) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for the benchmark's server."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(
        base_url=url, timeout=httpx.Timeout(60, read=None), limits=limits
    ) as client:
        yield client


def run_async(coro: Any, limit_s: float = 900) -> Any:
    """Run a coroutine with a hard ceiling so that no benchmark hangs.

    On the event loop agentrt's processes run on (server/loops.py), so that the engine
    measured here in-process has the same loop as the servers it is compared with.
    """

    async def bounded() -> Any:
        async with asyncio.timeout(limit_s):
            return await coro

    return loops.run(bounded(), "auto")
