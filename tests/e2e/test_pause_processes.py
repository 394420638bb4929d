"""Pause and resume across processes: the API in the test, runs in `agentrt worker` processes."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import SseEvent, read_sse, rebuild_output, serve, wait_for_status
from tests.support.processes import WorkerProcess, worker_env, write_scripts

pytestmark = pytest.mark.timeout(360)

PREAMBLE = "Counting the visitors now, one moment please."
WORKER_SETTINGS = {
    "lease_seconds": 2.0,
    "worker_poll_seconds": 0.5,
    "tool_modules": ["tests.support.tools:bump_counter"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("pause-proc")
    counter = folder / "counter"
    bump = ScriptedToolCall(id="b1", name="bump_counter", args={"path": str(counter)})
    scripts = {
        "count": [
            ScriptedTurn(text=PREAMBLE, chunk_chars=1, delay_s=0.05, tool_calls=[bump]),
            ScriptedTurn(text="Counted once."),
        ]
    }
    return write_scripts(folder / "scripts.json", scripts), counter


@pytest.fixture(scope="module")
def env(database_url: str, files: tuple[Path, Path]) -> dict[str, str]:
    return worker_env(database_url, scripted_models_file=str(files[0]), **WORKER_SETTINGS)


@pytest.fixture(scope="module")
async def client(settings: Settings, files: tuple[Path, Path]) -> AsyncIterator[httpx.AsyncClient]:
    api = settings.model_copy(
        update={"run_workers": False, "scripted_models_file": files[0], **WORKER_SETTINGS}
    )
    async with (
        serve(create_app(api, models=ModelRegistry(api))) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        yield c


@contextlib.asynccontextmanager
async def workers(env: dict[str, str], count: int) -> AsyncIterator[list[WorkerProcess]]:
    """Start `count` worker processes, allowing for a slow start on a loaded machine."""
    started = [WorkerProcess(env) for _ in range(count)]
    try:
        await asyncio.gather(*(w.start(limit_s=150) for w in started))
        yield started
    finally:
        await asyncio.gather(*(w.close() for w in started), return_exceptions=True)


async def start(client: httpx.AsyncClient) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": "scripted:count"}
    )
    assert response.status_code == 202, response.text
    run: dict[str, Any] = response.json()
    async with asyncio.timeout(60):  # wait until the first answer is streaming
        while True:
            snap = (await client.get(f"/api/runs/{run['runId']}/snapshot")).json()
            if snap["items"] and snap["items"][0]["text"]:
                return run
            await asyncio.sleep(0.01)


async def completed(client: httpx.AsyncClient, run: dict[str, Any]) -> list[SseEvent]:
    async with asyncio.timeout(60):
        events = await read_sse(client, run["streamUrl"])
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert events[-1].event == "run.completed", [e.event for e in events]
    snap = (await client.get(f"/api/runs/{run['runId']}/snapshot")).json()
    conv = run["conversationId"]
    messages = (await client.get(f"/api/conversations/{conv}/messages")).json()["messages"]
    assert rebuild_output(events) == snap["output"] == messages[-1]["content"]
    assert rebuild_output(events) == PREAMBLE + "\n\nCounted once."
    return events


async def test_a_pause_reaches_the_worker_process_that_runs_the_run(
    client: httpx.AsyncClient, env: dict[str, str], pool: Pool, files: tuple[Path, Path]
) -> None:
    counter = files[1]
    counter.unlink(missing_ok=True)
    async with workers(env, 1) as (worker,):
        run = await start(client)
        assert (await client.post(f"/api/runs/{run['runId']}/pause")).status_code == 202
        record = await wait_for_status(client, run["runId"], "paused")
        assert record["leaseOwner"] is None and not counter.exists()
        assert worker.proc is not None
        # The worker process let go of the run: its registry row counts no active run.
        async with asyncio.timeout(30):
            while True:
                async with pool.connection() as conn:
                    cur = await conn.execute(
                        "SELECT active_runs AS n FROM workers WHERE pid = %s", (worker.proc.pid,)
                    )
                    row = await cur.fetchone()
                if row is not None and row["n"] == 0:
                    break
                await asyncio.sleep(0.2)
        assert worker.proc.returncode is None

        assert (await client.post(f"/api/runs/{run['runId']}/resume")).status_code == 200
        events = await completed(client, run)
    kinds = [e.event for e in events]
    assert kinds.count("run.paused") == 1 and kinds.count("run.resumed") == 1
    assert kinds.count("tool.started") == 1 and "run.requeued" not in kinds
    assert len(counter.read_text().splitlines()) == 1


async def test_a_pause_its_dead_worker_never_saw_takes_effect_when_the_run_is_recovered(
    client: httpx.AsyncClient, env: dict[str, str], files: tuple[Path, Path]
) -> None:
    counter = files[1]
    counter.unlink(missing_ok=True)
    async with workers(env, 2) as pair:
        run = await start(client)
        owner = (await client.get(f"/api/runs/{run['runId']}")).json()["leaseOwner"]
        (first,) = [w for w in pair if w.proc is not None and f":{w.proc.pid}:" in owner]
        first.signal(signal.SIGSTOP)  # it will never hear of the pause
        response = await client.post(f"/api/runs/{run['runId']}/pause")
        assert response.status_code == 202 and response.json()["pauseRequested"] is True
        first.signal(signal.SIGKILL)
        await wait_for_status(client, run["runId"], "paused", limit_s=60)
        assert (await client.post(f"/api/runs/{run['runId']}/resume")).status_code == 200
        events = await completed(client, run)
    kinds = [e.event for e in events]
    # Recovered into the queue, then paused at the claim instead of started.
    requeued = kinds.index("run.requeued")
    assert kinds[requeued + 1] == "run.paused"
    assert events[requeued + 1].data["data"]["from"] == "queued"
    assert kinds.count("run.started") == 2 and kinds.count("tool.started") == 1
    assert len(counter.read_text().splitlines()) == 1
