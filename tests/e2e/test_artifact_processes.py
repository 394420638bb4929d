"""Artifacts across real processes: a worker killed mid-write, and 200 MB through flat memory.

Runs execute in `agentrt worker` (or `agentrt serve`) processes with the scripted model;
artifacts are on local storage shared by the processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import free_port, read_sse, serve
from tests.support.processes import WorkerProcess, worker_env, workers, write_scripts

pytestmark = pytest.mark.timeout(420)
SLOW_S = 240
BIG_BYTES = 200 * 1024 * 1024
# Streaming holds a few 1 MiB chunks; content held whole would add at least 200 MB.
PEAK_GROWTH_LIMIT = 80 * 1024 * 1024
SCRIPTS = {
    "hold": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(
                    id="c_hold", name="render_chart", args={"size": 200_000, "hold_s": 120}
                )
            ]
        ),
        ScriptedTurn(text="Charted."),
    ],
    "big": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(
                    id="c_big",
                    name="write_artifact",
                    args={"name": "big.bin", "from_file": "big.bin"},
                )
            ]
        ),
        ScriptedTurn(text="Saved."),
    ],
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("artifact-procs")
    (path / "workspace").mkdir()
    write_scripts(path / "scripts.json", SCRIPTS)
    return path


@pytest.fixture(scope="module")
def options(folder: Path) -> dict[str, Any]:
    return {
        "lease_seconds": 2.0,
        "worker_poll_seconds": 0.5,
        "scripted_models_file": str(folder / "scripts.json"),
        "tool_modules": ["tests.support.artifact_tools:render_chart"],
        "artifact_dir": str(folder / "store"),
        "artifact_file_root": str(folder / "workspace"),
    }


@pytest.fixture(scope="module")
async def client(settings: Settings, options: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    paths = ("scripted_models_file", "artifact_dir", "artifact_file_root")
    typed = {k: Path(v) if k in paths else v for k, v in options.items()}
    api = settings.model_copy(update={**typed, "run_workers": False})
    async with (
        serve(create_app(api, models=ModelRegistry(api))) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        yield c


async def post(client: httpx.AsyncClient, model: str) -> str:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": f"scripted:{model}"}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["runId"])


async def wait_for_artifact(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async with asyncio.timeout(SLOW_S):
        while True:
            snap = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
            if snap.get("artifacts"):
                return dict(snap)
            await asyncio.sleep(0.05)


def owner_of(candidates: list[WorkerProcess], record: dict[str, Any]) -> WorkerProcess:
    for worker in candidates:
        assert worker.proc is not None
        if f":{worker.proc.pid}:" in (record.get("leaseOwner") or ""):
            return worker
    raise AssertionError(f"no worker holds {record.get('leaseOwner')}")


async def test_a_worker_killed_after_writing_leaves_one_version_and_the_run_completes(
    client: httpx.AsyncClient, database_url: str, options: dict[str, Any]
) -> None:
    env = worker_env(database_url, **options)
    async with workers(env, 2) as pair:
        run_id = await post(client, "hold")
        await wait_for_artifact(client, run_id)  # stored, and the tool now holds for 120 s
        record = (await client.get(f"/api/runs/{run_id}")).json()
        owner_of(pair, record).signal(signal.SIGKILL)
        events = await read_sse(client, f"/api/runs/{run_id}/events")
    assert events[-1].event == "run.completed", events[-1].data
    assert [e.event for e in events].count("run.started") == 2
    written = [e.data["data"] for e in events if e.event.startswith("artifact.")]
    assert [w["version"] for w in written] in ([1], [1, 1])
    assert [w["replayed"] for w in written][1:] in ([], [True])

    listed = (await client.get(f"/api/runs/{run_id}/artifacts")).json()["artifacts"]
    assert [(a["name"], a["version"]) for a in listed] == [("chart.png", 1)]
    record = (await client.get(f"/api/artifacts/{listed[0]['id']}")).json()
    assert [v["version"] for v in record["versions"]] == [1]
    content = (await client.get(listed[0]["link"])).content
    # The bytes the first execution wrote (the re-run's would differ: they are random).
    assert f"sha256:{hashlib.sha256(content).hexdigest()}" == written[0]["checksum"]


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak(pid: int) -> bool:
    """Reset the process's peak RSS to its current RSS (Linux `clear_refs`, value 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _make_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as handle:
        for _ in range(size // (1 << 20)):
            block = os.urandom(1 << 20)
            digest.update(block)
            handle.write(block)
    return digest.hexdigest()


@contextlib.asynccontextmanager
async def serve_process(env: dict[str, str]) -> AsyncIterator[tuple[str, int]]:
    port = free_port()
    server = WorkerProcess(
        env, args=["serve", "--host", "127.0.0.1", "--port", str(port)], ready="starting on"
    )
    await server.start(limit_s=SLOW_S)
    base = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(SLOW_S), httpx.AsyncClient(base_url=base) as probe:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await probe.get("/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        assert server.proc is not None
        yield base, server.proc.pid
    finally:
        await server.close()


async def test_a_200_mb_artifact_is_written_and_downloaded_with_flat_server_memory(
    database_url: str, options: dict[str, Any], folder: Path
) -> None:
    expected = await asyncio.to_thread(_make_file, folder / "workspace" / "big.bin", BIG_BYTES)
    env = worker_env(database_url, **options)
    async with (
        serve_process(env) as (base, pid),
        httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(60, read=SLOW_S)) as client,
    ):
        await client.get("/api/runs")  # warm the request path before measuring
        start = _status(pid)
        exact = _reset_peak(pid)
        # Without a reset the peak may be start-up's: measure from it instead.
        before = start["VmRSS"] if exact else max(start["VmRSS"], start["VmHWM"])
        run_id = await post(client, "big")
        events = await read_sse(client, f"/api/runs/{run_id}/events")
        assert events[-1].event == "run.completed", events[-1].data
        listed = (await client.get(f"/api/runs/{run_id}/artifacts")).json()["artifacts"]
        assert [(a["name"], a["size"]) for a in listed] == [("big.bin", BIG_BYTES)]
        assert listed[0]["checksum"] == f"sha256:{expected}"
        digest, received = hashlib.sha256(), 0
        async with client.stream("GET", listed[0]["link"]) as response:
            assert response.status_code == 200
            assert response.headers["content-length"] == str(BIG_BYTES)
            async for chunk in response.aiter_bytes():
                digest.update(chunk)
                received += len(chunk)
        peak = _status(pid)["VmHWM"]
    assert received == BIG_BYTES and digest.hexdigest() == expected
    growth = peak - before
    print(
        f"server peak RSS growth over a 200 MB write and download: {growth / 2**20:.1f} MiB "
        f"({'exact peak' if exact else 'peak since start'})"
    )
    assert growth < PEAK_GROWTH_LIMIT, f"peak RSS grew by {growth / 2**20:.1f} MiB"
