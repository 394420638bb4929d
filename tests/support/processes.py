"""Real `agentrt worker` processes for crash, drain and fencing tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from nodes.models.scripted import ScriptedTurn

ROOT = Path(__file__).resolve().parents[2]


def write_scripts(path: Path, scripts: Mapping[str, Sequence[ScriptedTurn]]) -> Path:
    """Write scripts in the `AGENTRT_SCRIPTED_MODELS_FILE` format."""
    path.write_text(json.dumps({n: [t.model_dump() for t in s] for n, s in scripts.items()}))
    return path


class WorkerProcess:
    """One `python -m server.cli worker` process (or another command), with its output captured.

    Args:
        env: The process environment (`worker_env`).
        args: The command's arguments after `python -m server.cli`.
        ready: Start-up is over once an output line contains this text.
        cwd: The working directory (the repository by default).
        program: What to run (default: `python -m server.cli`); `args` follow it.
    """

    def __init__(
        self,
        env: dict[str, str],
        args: Sequence[str] = ("worker",),
        ready: str = "ready",
        cwd: Path = ROOT,
        program: Sequence[str] = (sys.executable, "-m", "server.cli"),
    ) -> None:
        self.env = env
        self.program = list(program)
        self.args = list(args)
        self.ready_text = ready
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.output: list[str] = []
        self._reader: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._new_output = asyncio.Event()

    async def start(self, limit_s: float = 120) -> WorkerProcess:
        await self.launch()
        async with asyncio.timeout(limit_s):
            await self._ready.wait()
        return self

    async def launch(self) -> WorkerProcess:
        """Start the process without waiting for it to be ready."""
        self.proc = await asyncio.create_subprocess_exec(
            *self.program,
            *self.args,
            cwd=self.cwd,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_signals_as_from_a_shell,
        )
        self._reader = asyncio.create_task(self._read())
        return self

    def signal_state(self) -> str:
        """The process's blocked and ignored signal masks (Linux), for a failure's message."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        return " ".join(line for line in status if line.startswith(("SigBlk", "SigIgn")))

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.output.append(line)
            self._new_output.set()
            if self.args == ["worker"]:
                ready = "worker" in line and line.endswith("ready")
            else:
                ready = self.ready_text in line
            if ready:
                self._ready.set()

    async def wait_for_output(self, text: str, limit_s: float = 120) -> None:
        async with asyncio.timeout(limit_s):
            while not any(text in line for line in self.output):
                self._new_output.clear()
                await self._new_output.wait()

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signum)

    async def wait(self, limit_s: float = 120) -> int:
        assert self.proc is not None
        async with asyncio.timeout(limit_s):
            code = await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        return code

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            await self.wait()


def _signals_as_from_a_shell() -> None:
    """In the child, before exec: SIGINT and SIGTERM unblocked and at their defaults.

    A child inherits its parent's signal mask and ignored signals; a test process whose
    libraries blocked or ignored them (for a moment, in the thread that spawns) would start
    commands that a Ctrl-C cannot stop, as no shell ever starts them.
    """
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    for signum in signals:
        signal.signal(signum, signal.SIG_DFL)


def worker_env(database_url: str, **settings: Any) -> dict[str, str]:
    """Environment for a worker process: the test database plus `AGENTRT_*` settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env["DATABASE_URL"] = database_url
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in settings.items():
        env[f"AGENTRT_{key.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return env


@contextlib.asynccontextmanager
async def workers(env: dict[str, str], count: int = 1) -> AsyncIterator[list[WorkerProcess]]:
    """Start `count` worker processes; kill whatever is left at the end."""
    started = [WorkerProcess(env) for _ in range(count)]
    try:
        await asyncio.gather(*(w.start() for w in started))
        yield started
    finally:
        await asyncio.gather(*(w.close() for w in started), return_exceptions=True)
