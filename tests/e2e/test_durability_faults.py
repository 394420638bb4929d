"""Worker processes meeting database faults at the worst moment.

A checkpoint write refused between a model turn and its tool call, an answer checkpointed
but never logged before two crashes (or before an approval), a cancel or a drain arriving
while a finished run's outcome is being stored. Faults come from triggers in the real
Postgres (tests/support/faults.py); the API runs in the test process, runs in workers.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import FRESH_ID, ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.faults import HOLD_LOCK, arm, held_writes, install_faults
from tests.support.live import SseEvent, read_sse, rebuild_output, serve
from tests.support.processes import worker_env, workers, write_scripts

pytestmark = pytest.mark.timeout(300)

TERMINAL = ("run.completed", "run.failed", "run.cancelled")
WORKER_SETTINGS = {
    "lease_seconds": 2.0,
    "worker_poll_seconds": 0.5,
    "drain_grace_s": 0.5,
    "max_recoveries": 5,
    "tool_modules": ["tests.support.tools:bump_counter", "tests.support.tools:launch_rocket"],
}


def _scripts(counter: Path) -> dict[str, list[ScriptedTurn]]:
    def bump(call_id: str | None = None, hold_s: float = 0.0) -> ScriptedToolCall:
        args = {"path": str(counter), "hold_s": hold_s}
        return ScriptedToolCall(name="bump_counter", args=args, id=call_id)

    return {
        # A provider gives each call a new id, so a repeated model turn asks under a new key.
        "charge": [
            ScriptedTurn(text="Charging.", tool_calls=[bump(FRESH_ID)]),
            ScriptedTurn(text="Charged once."),
        ],
        "bump_then_stream": [
            ScriptedTurn(text="Bumping.", tool_calls=[bump(hold_s=2.0)]),
            ScriptedTurn(text="Bumped " + "once " * 40, chunk_chars=2, delay_s=0.05),
        ],
        "rocket": [
            ScriptedTurn(
                text="Launching.",
                tool_calls=[ScriptedToolCall(name="launch_rocket", args={"target": "moon"})],
            ),
            ScriptedTurn(text="Launched."),
        ],
        "quick": [ScriptedTurn(text="Done.")],
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("faults")
    counter = folder / "counter"
    return write_scripts(folder / "scripts.json", _scripts(counter)), counter


@pytest.fixture(scope="module")
def env(database_url: str, files: tuple[Path, Path]) -> dict[str, str]:
    return worker_env(database_url, scripted_models_file=str(files[0]), **WORKER_SETTINGS)


@pytest.fixture(scope="module")
async def client(
    settings: Settings, files: tuple[Path, Path], pool: Pool
) -> AsyncIterator[httpx.AsyncClient]:
    api = settings.model_copy(
        update={"run_workers": False, "scripted_models_file": files[0], **WORKER_SETTINGS}
    )
    async with (
        serve(create_app(api, models=ModelRegistry(api))) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        async with pool.connection() as conn:
            await install_faults(conn)
        yield c


async def post(
    client: httpx.AsyncClient, pool: Pool, model: str, fault: str | None = None
) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    if fault is not None:
        async with pool.connection() as conn:
            await arm(conn, conv, fault)
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": f"scripted:{model}"}
    )
    assert response.status_code == 202, response.text
    return dict(response.json())


async def wait_for(check: Callable[[], Any], limit_s: float = 120) -> Any:
    """Poll `check` (sync or async) until it returns something truthy; return that."""
    async with asyncio.timeout(limit_s):
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return result
            await asyncio.sleep(0.05)


async def snapshot(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    return dict((await client.get(f"/api/runs/{run_id}/snapshot")).json())


async def finished(client: httpx.AsyncClient, run_id: str) -> list[SseEvent]:
    """Read the run's whole log once it ended; check it is gapless and matches the output."""
    events = await read_sse(client, f"/api/runs/{run_id}/events")
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert [e.event for e in events if e.event in TERMINAL] == [events[-1].event]
    snap = await snapshot(client, run_id)
    run = (await client.get(f"/api/runs/{run_id}")).json()
    messages = (await client.get(f"/api/conversations/{run['conversationId']}/messages")).json()
    assert rebuild_output(events) == snap["output"]
    if events[-1].event == "run.completed":
        assert messages["messages"][-1]["content"] == snap["output"]
    return events


def _kept(snap: dict[str, Any], text: str) -> list[dict[str, Any]]:
    return [i for i in snap["items"] if i["text"] == text and i["status"] != "superseded"]


async def test_a_refused_checkpoint_stops_the_attempt_before_the_tool_runs(
    client: httpx.AsyncClient, env: dict[str, str], pool: Pool, files: tuple[Path, Path]
) -> None:
    counter = files[1]
    counter.unlink(missing_ok=True)
    async with workers(env, 1):
        run = await post(client, pool, "charge", fault="checkpoint")
        events = await finished(client, run["runId"])
    requests = counter.read_text().splitlines()
    assert len(requests) == 1, requests  # the outside system was charged once
    assert events[-1].event == "run.completed"
    assert rebuild_output(events) == "Charging.\n\nCharged once."
    assert [e.data["data"]["reason"] for e in events if e.event == "run.requeued"] == [
        "lease expired"
    ]


async def test_an_unlogged_answer_appears_once_after_two_crashes(
    client: httpx.AsyncClient, env: dict[str, str], pool: Pool, files: tuple[Path, Path]
) -> None:
    counter = files[1]
    counter.unlink(missing_ok=True)
    run = await post(client, pool, "bump_then_stream", fault="events")
    async with workers(env, 1) as (first,):
        # Attempt 1 checkpointed "Bumping." and is in its tool; the log has none of it.
        await wait_for(counter.exists)
        first.signal(signal.SIGKILL)
        await first.wait()

    async def replayed_then_streaming() -> bool:
        snap = await snapshot(client, run["runId"])
        statuses = [i["status"] for i in snap["items"]]
        return snap["attempt"] == 2 and statuses[-2:] == ["completed", "streaming"]

    async with workers(env, 1) as (second,):
        await wait_for(replayed_then_streaming)
        second.signal(signal.SIGKILL)
        await second.wait()
    async with workers(env, 1):
        events = await finished(client, run["runId"])
    snap = await snapshot(client, run["runId"])
    assert events[-1].event == "run.completed"
    assert snap["output"] == "Bumping.\n\nBumped " + "once " * 40
    assert len(_kept(snap, "Bumping.")) == 1
    assert [e.event for e in events].count("run.requeued") == 2


async def test_an_unlogged_answer_appears_once_after_an_approval(
    client: httpx.AsyncClient, env: dict[str, str], pool: Pool
) -> None:
    run = await post(client, pool, "rocket", fault="events")

    async def interrupt_checkpointed() -> bool:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM checkpoint_writes"
                " WHERE thread_id = %s AND channel = '__interrupt__'",
                (run["conversationId"],),
            )
            return await cur.fetchone() is not None

    async with workers(env, 1) as (first,):
        try:
            await wait_for(interrupt_checkpointed)
        except TimeoutError:
            raise AssertionError(await _stuck(pool, run["runId"], first.output)) from None
        first.signal(signal.SIGKILL)
        await first.wait()
    async with workers(env, 1):
        await wait_for(lambda: _status_is(client, run["runId"], "waiting_user"))
        (approval,) = (await client.get(f"/api/runs/{run['runId']}/approvals")).json()["approvals"]
        decided = await client.post(
            f"/api/approvals/{approval['approvalId']}", json={"decision": "approve"}
        )
        assert decided.status_code == 200, decided.text
        events = await finished(client, run["runId"])
    snap = await snapshot(client, run["runId"])
    assert events[-1].event == "run.completed"
    assert snap["output"] == "Launching.\n\nLaunched."
    assert len(_kept(snap, "Launching.")) == 1


async def _stuck(pool: Pool, run_id: str, output: list[str]) -> str:
    """What a run that stopped short left behind: its row, its log, its worker's last lines."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status, attempt, lease_owner, recoveries FROM runs WHERE id = %s", (run_id,)
        )
        row = await cur.fetchone()
        cur = await conn.execute(
            "SELECT seq, type, attempt FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,)
        )
        events = [(r["seq"], r["type"], r["attempt"]) for r in await cur.fetchall()]
    worker = "\n".join(output[-60:])
    return f"run {run_id} stopped short: {row}\nevents: {events}\nworker:\n{worker}"


async def _status_is(client: httpx.AsyncClient, run_id: str, status: str) -> bool:
    return bool((await client.get(f"/api/runs/{run_id}")).json()["status"] == status)


async def test_a_cancel_while_the_outcome_is_stored_ends_the_run_at_once(
    client: httpx.AsyncClient, env: dict[str, str], pool: Pool
) -> None:
    run = await post(client, pool, "quick", fault="hold_spans")
    async with pool.connection() as holder, workers(env, 1) as (worker,):
        await holder.execute("SELECT pg_advisory_lock(%s)", (HOLD_LOCK,))
        try:
            async with pool.connection() as conn:
                await wait_for(lambda: held_writes(conn))
            response = await client.post(f"/api/runs/{run['runId']}/cancel")
            assert response.status_code == 202, response.text
            await worker.wait_for_output("stopping (cancel)", limit_s=120)
        finally:
            await holder.execute("SELECT pg_advisory_unlock(%s)", (HOLD_LOCK,))
        events = await finished(client, run["runId"])
    assert events[-1].event in ("run.completed", "run.cancelled")
    assert "run.requeued" not in [e.event for e in events]
    assert not any("destroyed but it is pending" in line for line in worker.output)


async def test_a_drain_while_the_outcome_is_stored_ends_the_run_at_once(
    client: httpx.AsyncClient, env: dict[str, str], pool: Pool
) -> None:
    run = await post(client, pool, "quick", fault="hold_spans")
    async with pool.connection() as holder, workers(env, 1) as (worker,):
        await holder.execute("SELECT pg_advisory_lock(%s)", (HOLD_LOCK,))
        try:
            async with pool.connection() as conn:
                await wait_for(lambda: held_writes(conn))
            worker.signal(signal.SIGTERM)
            await worker.wait_for_output("stopping (shutdown)", limit_s=120)
        finally:
            await holder.execute("SELECT pg_advisory_unlock(%s)", (HOLD_LOCK,))
        assert await worker.wait(limit_s=120) == 0
    record = (await client.get(f"/api/runs/{run['runId']}")).json()
    assert record["status"] == "completed", record
    events = await finished(client, run["runId"])
    assert "run.requeued" not in [e.event for e in events]
