"""A CPU-bound tool cannot stall its process: a real `agentrt serve` stays responsive.

The tool holds the GIL (a regular expression with catastrophic backtracking) far beyond its
timeout. Declared CPU-heavy, it runs in a child process that is killed at the timeout, while
the server answers `/healthz` and its worker keeps renewing the run's lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from tests.support.live import read_sse, wait_for_event
from tests.support.processes import worker_env, write_scripts
from tests.support.server_process import server_process

pytestmark = pytest.mark.timeout(300)

ENDED = ("completed", "failed", "cancelled")
LEASE_S = 3.0
TOOL_TIMEOUT_S = 6.0
SCRIPTS = {
    "crunch": [
        ScriptedTurn(tool_calls=[ScriptedToolCall(name="crunch", args={})]),
        ScriptedTurn(text="That took too long; I gave up."),
    ]
}


@pytest.fixture(scope="module")
async def base_url(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    folder = tmp_path_factory.mktemp("cpu")
    env = worker_env(
        database_url,
        environment="test",
        data_dir=str(folder / "data"),
        scripted_models_file=str(write_scripts(folder / "scripts.json", SCRIPTS)),
        tool_modules=["tests.support.cpu_tools:crunch"],
        tool_config={"default": {"tools": {"crunch": {"timeout_s": TOOL_TIMEOUT_S}}}},
        lease_seconds=LEASE_S,
        worker_poll_seconds=0.5,
    )
    async with server_process(env, folder / "server.log") as url:
        yield url


async def test_a_cpu_bound_tool_runs_to_its_timeout_while_the_server_answers(
    base_url: str,
) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
        posted = await client.post(
            f"/api/conversations/{conv}/messages",
            json={"content": "crunch it", "model": "scripted:crunch"},
        )
        assert posted.status_code == 202, posted.text
        run = posted.json()
        await wait_for_event(client, run["streamUrl"], "tool.started", limit_s=60)

        # While the tool works, every probe must answer within a few seconds (a stalled
        # process answers none until the tool ends), and the worker's heartbeat stays fresh.
        # The deadline is generous: the process's first CPU-heavy call waits for the forkserver
        # to start (outside the tool's timeout), which takes long on a loaded machine.
        probes = 0
        async with asyncio.timeout(180):
            while (await client.get(f"/api/runs/{run['runId']}")).json()["status"] not in ENDED:
                async with asyncio.timeout(LEASE_S):
                    health = await client.get("/healthz")
                    queue = (await client.get("/api/admin/queue")).json()
                assert health.status_code == 200
                ages = [w["heartbeatAgeSeconds"] for w in queue["workers"]]
                assert ages and max(ages) < LEASE_S, queue["workers"]
                assert queue["expiredLeases"] == []
                probes += 1
                await asyncio.sleep(0.2)
        assert probes >= 3

        events = await read_sse(client, run["streamUrl"])
    kinds = [e.event for e in events]
    assert kinds[-1] == "run.completed", kinds
    assert "run.requeued" not in kinds
    (failed,) = [e.data for e in events if e.event == "tool.failed"]
    assert failed["data"]["errorType"] == "timeout"
    assert failed["data"]["error"] == f"crunch did not finish within {TOOL_TIMEOUT_S:g} s"
