"""A queued run's ticket wakes the worker it names, not every idle one; none waits for a poll.

The API runs in the test process (no workers); runs execute in `agentrt worker` processes
that poll so rarely that a run started by a poll fails the test. Each worker serves its
metrics, whose claim counts say which workers claimed.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from nodes.models.scripted import ScriptedTurn
from server.runs.tickets import LIVE_WORKERS_SQL, named_worker
from server.settings import Settings
from tests.support.live import api_client, free_port, post_in_new_conversation, read_sse
from tests.support.processes import WorkerProcess, worker_env, write_scripts

pytestmark = pytest.mark.timeout(300)
SCRIPTS = {"quick": [ScriptedTurn(text="done")]}
SETTINGS = {
    "worker_poll_seconds": 600.0,  # far beyond every deadline below
    "lease_seconds": 1.5,  # a heartbeat, and a read of the live workers, every 0.5 s
    "worker_concurrency": 4,
}
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def scripts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scripts(tmp_path_factory.mktemp("tickets") / "scripts.json", SCRIPTS)


@pytest.fixture(scope="module")
async def client(settings: Settings, scripts_file: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings, scripted_models_file=scripts_file, **SETTINGS) as c:
        yield c


class Counted:
    """A worker process that serves its metrics."""

    def __init__(self, database_url: str, scripts_file: Path, grace_s: float) -> None:
        self.port = free_port()
        self.process = WorkerProcess(
            worker_env(
                database_url,
                scripted_models_file=str(scripts_file),
                metrics_port=self.port,
                worker_ticket_grace_s=grace_s,
                **SETTINGS,
            )
        )

    @property
    def owner(self) -> str:
        said = next(line for line in self.process.output if line.endswith(" ready"))
        return said.split()[2]

    async def stop(self) -> None:
        """Drain (its `workers` row goes with it), then make sure the process is gone."""
        if self.process.proc is not None and self.process.proc.returncode is None:
            self.process.signal(signal.SIGTERM)
            await self.process.wait()
        await self.process.close()

    async def claims(self) -> dict[str, float]:
        async with httpx.AsyncClient() as c:
            text = (await c.get(f"http://127.0.0.1:{self.port}/metrics")).text
        found = re.findall(r'^agentrt_worker_claims_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
        return {outcome: float(n) for outcome, n in found}


@pytest.fixture
async def two(database_url: str, scripts_file: Path) -> AsyncIterator[list[Counted]]:
    # A grace longer than any run here: on a loaded machine a look after the default 0.25 s
    # could find a run its named worker had not claimed yet, and claim it first.
    started = [Counted(database_url, scripts_file, grace_s=30.0) for _ in range(2)]
    try:
        await asyncio.gather(*(w.process.start() for w in started))
        await _seen_by_each_other(database_url)
        yield started
    finally:
        await asyncio.gather(*(w.stop() for w in started), return_exceptions=True)


async def _seen_by_each_other(database_url: str) -> None:
    """Until every worker has heartbeaten (and read the live workers) well after all joined."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        async with asyncio.timeout(DEADLINE_S):
            while True:
                cur = await conn.execute(
                    "SELECT bool_and(last_heartbeat_at > joined + interval '1 second')"
                    " FROM workers, (SELECT max(started_at) AS joined FROM workers) j"
                )
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return
                await asyncio.sleep(0.1)


async def _live(database_url: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(LIVE_WORKERS_SQL, (SETTINGS["lease_seconds"],))
        return [row[0] for row in await cur.fetchall()]


async def _run_to_its_end(client: httpx.AsyncClient) -> dict[str, Any]:
    run_id = (await post_in_new_conversation(client, "scripted:quick"))["runId"]
    async with asyncio.timeout(DEADLINE_S):
        while (run := (await client.get(f"/api/runs/{run_id}")).json())["status"] != "completed":
            assert run["status"] in {"queued", "running"}, run
            await asyncio.sleep(0.02)
    events = await read_sse(client, f"/api/runs/{run_id}/events")
    started = [e for e in events if e.event == "run.started"]
    return {"id": run_id, "worker": started[0].data["data"]["worker"]}


async def test_each_run_is_claimed_by_the_worker_its_ticket_names_and_no_other_claims(
    client: httpx.AsyncClient, database_url: str, two: list[Counted]
) -> None:
    live = await _live(database_url)
    assert sorted(w.owner for w in two) == live
    before = [await w.claims() for w in two]
    runs = [await _run_to_its_end(client) for _ in range(8)]
    after = [await w.claims() for w in two]
    for run in runs:
        assert run["worker"] == named_worker(run["id"], live)
    found = sum(a.get("found", 0) - b.get("found", 0) for a, b in zip(after, before, strict=True))
    empty = sum(a.get("empty", 0) - b.get("empty", 0) for a, b in zip(after, before, strict=True))
    assert found == len(runs)
    # Without tickets the idle worker not named claims too, and finds nothing: one a run.
    assert empty <= 1, (before, after)


async def test_a_run_named_to_a_worker_that_is_gone_starts_on_an_idle_one_within_the_grace(
    client: httpx.AsyncClient, database_url: str, scripts_file: Path
) -> None:
    # A registered worker with a fresh heartbeat and no process: killed since the others read.
    gone = "gone:0:worker"
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO workers (id, host, pid, concurrency, last_heartbeat_at)"
            " VALUES (%s, 'gone', 0, 4, now() + interval '1 hour')",
            (gone,),
        )
    alive = Counted(database_url, scripts_file, grace_s=0.25)
    try:
        await alive.process.start()
        await _seen_by_each_other(database_url)
        live = await _live(database_url)
        assert live == sorted([gone, alive.owner])
        runs = []
        while sum(named_worker(r["id"], live) == gone for r in runs) < 3:
            runs.append(await _run_to_its_end(client))
            assert len(runs) < 40, "no run's ticket named the gone worker"
        assert {r["worker"] for r in runs} == {alive.owner}
    finally:
        await alive.stop()
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute("DELETE FROM workers WHERE id = %s", (gone,))
