"""The embedded PostgreSQL is shared by agentrt processes and stopped by the last one to exit.

`agentrt db stop` stops one that was left running (its users were killed with SIGKILL).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from server.db import embedded
from tests.support.live import free_port
from tests.support.processes import ROOT, WorkerProcess, worker_env

pytestmark = pytest.mark.timeout(400)


def embedded_env(data_dir: Path) -> dict[str, str]:
    env = worker_env("", data_dir=str(data_dir))
    del env["DATABASE_URL"]
    env.pop("XDG_RUNTIME_DIR", None)  # as in containers, cron and ssh sessions
    return env


async def wait_until_stopped(data_dir: Path, limit_s: float = 60) -> None:
    async with asyncio.timeout(limit_s):
        while True:
            if embedded.postmaster_pid(data_dir) is None:
                return
            await asyncio.sleep(0.1)


async def test_the_last_process_to_exit_stops_the_embedded_database(tmp_path: Path) -> None:
    env = embedded_env(tmp_path)
    port = free_port()
    api = WorkerProcess(env, ["serve", "--port", str(port)], ready="Application startup complete")
    worker = WorkerProcess(env)
    try:
        await api.start(limit_s=180)
        await worker.start(limit_s=180)
        assert not any("XDG_RUNTIME_DIR" in line for line in api.output + worker.output)
        postgres = embedded.postmaster_pid(tmp_path)
        assert postgres is not None
        assert sorted(embedded.live_users(tmp_path)) == sorted(
            p.proc.pid for p in (api, worker) if p.proc is not None
        )

        api.signal(signal.SIGTERM)
        assert await api.wait(limit_s=60) == 0
        assert embedded.postmaster_pid(tmp_path) == postgres  # the worker still uses it

        worker.signal(signal.SIGTERM)
        assert await worker.wait(limit_s=60) == 0
        await wait_until_stopped(tmp_path)
    finally:
        await asyncio.gather(api.close(), worker.close())
        embedded.stop(tmp_path, force=True)


async def test_db_stop_stops_a_database_left_running_by_killed_processes(
    tmp_path: Path,
) -> None:
    env = embedded_env(tmp_path)
    worker = WorkerProcess(env)
    try:
        await worker.start(limit_s=180)
        worker.signal(signal.SIGKILL)
        await worker.wait(limit_s=30)
        assert embedded.postmaster_pid(tmp_path) is not None

        stop = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "server.cli", "db", "stop"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert stop.returncode == 0, stop.stderr
        assert "stopped the embedded database" in stop.stdout
        await wait_until_stopped(tmp_path, limit_s=10)
    finally:
        await worker.close()
        embedded.stop(tmp_path, force=True)


async def test_db_stop_refuses_while_a_process_uses_the_database(tmp_path: Path) -> None:
    env = embedded_env(tmp_path)
    worker = WorkerProcess(env)
    try:
        await worker.start(limit_s=180)
        stop = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "server.cli", "db", "stop"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert stop.returncode == 1
        assert worker.proc is not None and str(worker.proc.pid) in stop.stderr
        assert embedded.postmaster_pid(tmp_path) is not None
    finally:
        await worker.close()
        embedded.stop(tmp_path, force=True)
