"""Real worker processes: kill -9, SIGTERM drain, SIGSTOP fencing, dead letter.

The API runs in the test process (no workers); runs execute in `agentrt worker` processes.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from tests.support.live import (
    SseEvent,
    api_client,
    assert_items_carry_their_text,
    read_sse,
    rebuild_output,
    serve,
)
from tests.support.processes import WorkerProcess, worker_env, workers, write_scripts

# Deadlines are generous: the suite must pass on a loaded 2-core machine beside another suite.
pytestmark = pytest.mark.timeout(300)
SLOW_S = 120

ANSWER = "tock " * 150
SCRIPTS = {
    "stream": [
        ScriptedTurn(
            text="Looking at the clock.",
            chunk_chars=6,
            tool_calls=[ScriptedToolCall(name="current_time", args={})],
        ),
        ScriptedTurn(text=ANSWER, chunk_chars=5, delay_s=0.02),
    ],
    "slow_tool": [
        ScriptedTurn(
            text="Bumping.",
            tool_calls=[
                ScriptedToolCall(name="bump_counter", args={"path": "COUNTER", "hold_s": 1.5})
            ],
        ),
        ScriptedTurn(text="Bumped once."),
    ],
    "rocket": [
        ScriptedTurn(tool_calls=[ScriptedToolCall(name="launch_rocket", args={"target": "moon"})]),
        ScriptedTurn(text="Launched."),
    ],
}
WORKER_SETTINGS = {
    "lease_seconds": 2.0,
    "worker_poll_seconds": 0.5,
    "drain_grace_s": 10.0,
    "tool_modules": ["tests.support.tools:bump_counter", "tests.support.tools:launch_rocket"],
}


@pytest.fixture(scope="module")
def scripts_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("proc")
    counter = folder / "counter"
    scripts = {
        **SCRIPTS,
        "slow_tool": [
            t.model_copy(
                update={
                    "tool_calls": [
                        c.model_copy(update={"args": {**c.args, "path": str(counter)}})
                        for c in t.tool_calls
                    ]
                }
            )
            for t in SCRIPTS["slow_tool"]
        ],
    }
    return write_scripts(folder / "scripts.json", scripts), counter


@pytest.fixture(scope="module")
def env(database_url: str, scripts_file: tuple[Path, Path]) -> dict[str, str]:
    return worker_env(database_url, scripted_models_file=str(scripts_file[0]), **WORKER_SETTINGS)


@pytest.fixture(scope="module")
async def client(
    settings: Settings, scripts_file: tuple[Path, Path]
) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings, scripted_models_file=scripts_file[0], **WORKER_SETTINGS) as c:
        yield c


async def post(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": f"scripted:{model}"}
    )
    assert response.status_code == 202, response.text
    return dict(response.json())


async def wait_until(client: httpx.AsyncClient, run_id: str, predicate: Any) -> dict[str, Any]:
    async with asyncio.timeout(SLOW_S):
        while True:
            snap = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
            if predicate(snap):
                return dict(snap)
            await asyncio.sleep(0.02)


def streaming_answer(snap: dict[str, Any]) -> bool:
    return len(snap["items"]) >= 2 and len(snap["items"][-1]["text"]) > 20


async def check_consistent(client: httpx.AsyncClient, run_id: str) -> list[SseEvent]:
    events = await read_sse(client, f"/api/runs/{run_id}/events")
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert events[-1].event == "run.completed", events[-1]
    snap = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
    run = (await client.get(f"/api/runs/{run_id}")).json()
    messages = (await client.get(f"/api/conversations/{run['conversationId']}/messages")).json()[
        "messages"
    ]
    assert rebuild_output(events) == snap["output"] == messages[-1]["content"]
    assert_items_carry_their_text(events)
    return events


async def test_kill_9_during_a_model_call_resumes_on_another_worker(
    client: httpx.AsyncClient, env: dict[str, str]
) -> None:
    async with workers(env, 2) as (a, b):
        run = await post(client, "stream")
        snap = await wait_until(client, run["runId"], streaming_answer)
        record = (await client.get(f"/api/runs/{run['runId']}")).json()
        (a if _owns(a, record) else b).signal(signal.SIGKILL)
        killed_at = time.monotonic()
        events = await check_consistent(client, run["runId"])
    assert rebuild_output(events) == "Looking at the clock.\n\n" + ANSWER
    kinds = [e.event for e in events]
    assert kinds.count("run.started") == 2 and kinds.count("tool.started") == 1
    assert [e.data["data"]["reason"] for e in events if e.event == "run.requeued"] == [
        "lease expired"
    ]
    assert (
        sum(
            1
            for e in events
            if e.event == "message.item.completed" and e.data["data"]["status"] == "superseded"
        )
        == 1
    )
    started = [e for e in events if e.event == "run.started"]
    assert started[1].data["data"]["worker"] != started[0].data["data"]["worker"]
    assert snap["status"] == "running" and time.monotonic() - killed_at < 30


def _owns(worker: WorkerProcess, record: dict[str, Any]) -> bool:
    assert worker.proc is not None
    return f":{worker.proc.pid}:" in (record.get("leaseOwner") or "")


async def test_kill_9_between_steps_resumes_without_repeating_the_tool(
    client: httpx.AsyncClient, env: dict[str, str]
) -> None:
    async with workers(env, 2) as (a, b):
        run = await post(client, "stream")
        await wait_until(
            client, run["runId"], lambda s: any(t["status"] == "completed" for t in s["toolCalls"])
        )
        record = (await client.get(f"/api/runs/{run['runId']}")).json()
        (a if _owns(a, record) else b).signal(signal.SIGKILL)
        events = await check_consistent(client, run["runId"])
    assert [e.event for e in events].count("tool.started") == 1
    assert rebuild_output(events) == "Looking at the clock.\n\n" + ANSWER


async def test_sigterm_drains_at_a_step_boundary_and_hands_the_run_back(
    client: httpx.AsyncClient, env: dict[str, str], pool: Pool, scripts_file: tuple[Path, Path]
) -> None:
    counter = scripts_file[1]
    counter.unlink(missing_ok=True)
    async with workers(env, 1) as (a,):
        run = await post(client, "slow_tool")
        await wait_until(
            client, run["runId"], lambda s: any(t["status"] == "running" for t in s["toolCalls"])
        )
        a.signal(signal.SIGTERM)
        sent = time.monotonic()
        assert await a.wait() == 0
        drained_in = time.monotonic() - sent
        record = (await client.get(f"/api/runs/{run['runId']}")).json()
        assert record["status"] == "queued"
        async with workers(env, 1):
            events = await check_consistent(client, run["runId"])
    assert drained_in < 10  # the grace period
    requeued = [e.data["data"] for e in events if e.event == "run.requeued"]
    assert requeued == [{"reason": "worker draining"}]
    assert counter.read_text().count("bump") == 1
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT recoveries, attempt FROM runs WHERE id = %s", (run["runId"],)
        )
        row = await cur.fetchone()
    assert row == {"recoveries": 0, "attempt": 2}


async def test_a_paused_worker_that_was_superseded_writes_nothing(
    client: httpx.AsyncClient, env: dict[str, str], pool: Pool
) -> None:
    async with workers(env, 1) as (a,):
        run = await post(client, "stream")
        await wait_until(client, run["runId"], streaming_answer)
        a.signal(signal.SIGSTOP)
        async with workers(env, 1):
            events = await check_consistent(client, run["runId"])
            async with pool.connection() as conn:
                before = await _writes(conn, run)
            a.signal(signal.SIGCONT)
            # Woken, it must find its lease gone (heartbeat or a refused write) and stop.
            await a.wait_for_output("lease lost", limit_s=SLOW_S)
            async with pool.connection() as conn:
                after = await _writes(conn, run)
    assert after == before
    takeover = next(e.id for e in events if e.event == "run.requeued")
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM run_events WHERE run_id = %s AND seq > %s AND attempt = 1",
            (run["runId"], takeover),
        )
        stale = await cur.fetchone()
    assert stale == {"n": 0}


async def _writes(conn: Any, run: dict[str, Any]) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT (SELECT count(*) FROM run_events WHERE run_id = %(r)s) AS events,"
        " (SELECT count(*) FROM checkpoints WHERE thread_id = %(c)s) AS checkpoints,"
        " (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(c)s) AS writes,"
        " (SELECT status FROM runs WHERE id = %(r)s) AS status",
        {"r": run["runId"], "c": run["conversationId"]},
    )
    return dict(await cur.fetchone())


async def test_a_run_that_keeps_losing_its_worker_is_dead_lettered(
    client: httpx.AsyncClient, database_url: str, scripts_file: tuple[Path, Path]
) -> None:
    env = worker_env(
        database_url,
        scripted_models_file=str(scripts_file[0]),
        **{**WORKER_SETTINGS, "max_recoveries": 1},
    )
    run = await post(client, "stream")
    for attempt in (1, 2):
        async with workers(env, 1) as (w,):
            await wait_until(
                client, run["runId"], lambda s, n=attempt: s["attempt"] == n and streaming_answer(s)
            )
            w.signal(signal.SIGKILL)
            await w.wait()
    async with workers(env, 1):
        events = await read_sse(client, f"/api/runs/{run['runId']}/events")
    assert events[-1].event == "run.failed"
    assert events[-1].data["data"]["errorType"] == "dead_letter"
    assert "AGENTRT_MAX_RECOVERIES" in events[-1].data["data"]["message"]
    assert [e.event for e in events].count("run.started") == 2
    record = (await client.get(f"/api/runs/{run['runId']}")).json()
    assert record["status"] == "failed" and record["error"]["type"] == "dead_letter"


async def test_cancel_reaches_a_run_in_another_process_within_seconds(
    client: httpx.AsyncClient, env: dict[str, str]
) -> None:
    async with workers(env, 1):
        run = await post(client, "stream")
        await wait_until(client, run["runId"], streaming_answer)
        asked = time.monotonic()
        response = await client.post(f"/api/runs/{run['runId']}/cancel")
        assert response.status_code == 202
        events = await read_sse(client, run["streamUrl"])
        took = time.monotonic() - asked
    assert events[-1].event == "run.cancelled"
    assert [e.event for e in events].count("run.cancelled") == 1
    assert took < 5, f"cancel took {took:.1f}s"


async def test_kill_9_during_a_tool_call_does_not_repeat_its_side_effect(
    client: httpx.AsyncClient, env: dict[str, str], scripts_file: tuple[Path, Path]
) -> None:
    counter = scripts_file[1]
    counter.unlink(missing_ok=True)
    async with workers(env, 2) as (a, b):
        run = await post(client, "slow_tool")
        await wait_until(
            client,
            run["runId"],
            lambda s: counter.exists() and any(t["status"] == "running" for t in s["toolCalls"]),
        )
        record = (await client.get(f"/api/runs/{run['runId']}")).json()
        (a if _owns(a, record) else b).signal(signal.SIGKILL)  # mid-tool, after its effect
        events = await check_consistent(client, run["runId"])
    requests = counter.read_text().splitlines()
    assert len(set(requests)) == 1, requests  # the outside system saw one request key
    assert rebuild_output(events).endswith("Bumped once.")
    assert [e.data["data"]["reason"] for e in events if e.event == "run.requeued"] == [
        "lease expired"
    ]


async def test_a_run_waiting_for_approval_survives_a_full_stop(
    settings: Settings, scripts_file: tuple[Path, Path], env: dict[str, str]
) -> None:
    api = settings.model_copy(
        update={"run_workers": False, "scripted_models_file": scripts_file[0], **WORKER_SETTINGS}
    )
    async with (
        serve(create_app(api)) as url,
        httpx.AsyncClient(base_url=url) as first,
        workers(env, 1) as (w,),
    ):
        run = await post(first, "rocket")
        await wait_until(first, run["runId"], lambda s: s["status"] == "waiting_user")
        w.signal(signal.SIGTERM)
        assert await w.wait() == 0
    # Every process is gone. A new API and a new worker come up; a reviewer decides.
    async with serve(create_app(api)) as url, httpx.AsyncClient(base_url=url) as second:
        record = (await second.get(f"/api/runs/{run['runId']}")).json()
        assert record["status"] == "waiting_user" and record["leaseOwner"] is None
        async with workers(env, 1):
            (approval,) = (await second.get(f"/api/runs/{run['runId']}/approvals")).json()[
                "approvals"
            ]
            decided = await second.post(
                f"/api/approvals/{approval['approvalId']}", json={"decision": "approve"}
            )
            assert decided.status_code == 200, decided.text
            events = await check_consistent(second, run["runId"])
    assert rebuild_output(events) == "Launched."
    done = next(e for e in events if e.event == "tool.completed")
    assert done.data["data"]["output"] == "launched towards moon"
