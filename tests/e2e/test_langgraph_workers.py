"""LangGraph API runs in worker processes: `kill -9` recovery, and crons claimed once.

A graph of langgraph.json survives `kill -9` of its worker and streams what it would
in-process; a cron polled by two workers starts one run per due time.

The API runs in the test process without workers; runs execute in `agentrt worker` processes
that reach the fake OpenAI server of this process.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph_sdk import get_client

from server.app import create_app
from server.db.pool import Pool
from server.langgraph_api.serde import to_json
from server.settings import Settings
from tests.support import langgraph_server
from tests.support.fake_openai import FakeOpenAI, FakeToolCall, Reply
from tests.support.live import serve
from tests.support.processes import WorkerProcess, worker_env, workers

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 120
MODEL = "m-crash"
CALL = Reply(text="", tool_calls=[FakeToolCall("check_weather", {"city": "Oslo"}, id="call_w1")])
ANSWER = Reply(text="Sunny in Oslo: walk to dinner.", chunk_chars=5)
# A lease long enough not to expire on a loaded machine, short enough for a quick recovery.
WORKER_SETTINGS = {"lease_seconds": 10.0, "worker_poll_seconds": 0.5}
MODES = ["values", "updates", "custom"]
VOLATILE = {"id", "created", "system_fingerprint", "model_provider"}


# The fake model server of the LangGraph tests (tests/support/langgraph_server.py).
fake = langgraph_server.fake
model_env = langgraph_server.model_env


@pytest.fixture(scope="module")
async def url(settings: Settings, model_env: None) -> AsyncIterator[str]:
    api = settings.model_copy(
        update={"run_workers": False, "langgraph_config": ROOT / "langgraph.json"}
    )
    async with serve(create_app(api)) as base:
        yield base


def normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    return value


async def in_process(fake: FakeOpenAI, graph_input: Any, modes: Any = MODES) -> list[Any]:
    from examples.tool_agent.graph import builder

    fake.script(MODEL, CALL, ANSWER)
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "local"}}
    return [
        [mode, to_json(chunk)]
        async for mode, chunk in graph.astream(
            graph_input, config, stream_mode=modes, context={"model": MODEL}
        )
    ]


def _owns(worker: WorkerProcess, record: dict[str, Any]) -> bool:
    assert worker.proc is not None
    return f":{worker.proc.pid}:" in (record.get("leaseOwner") or "")


def worker_env_for(database_url: str, fake: FakeOpenAI, **settings: Any) -> dict[str, str]:
    env = worker_env(
        database_url,
        langgraph_config=str(ROOT / "langgraph.json"),
        **{**WORKER_SETTINGS, **settings},
    )
    env.update(OPENAI_BASE_URL=f"{fake.url}/v1", OPENAI_API_KEY="test-key")
    return env


async def _start(client: Any, graph_input: Any, modes: list[str]) -> tuple[str, Any]:
    """A thread, and a run of the tool agent on it streaming `modes`."""
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(
        tid, "tool_agent", input=graph_input, stream_mode=modes, context={"model": MODEL}
    )
    return tid, run


# LangGraph hands a step's `values` part to the stream after the step's checkpoint is written,
# so a worker can die with the checkpoint stored and the part not. With the default pace that
# window is a few milliseconds; with a long one the part waits for the next checkpoint write,
# which the killed worker never makes.
@pytest.mark.parametrize(
    "pace_s", [None, 600.0], ids=["default-pace", "last-values-part-not-stored"]
)
async def test_kill_9_mid_run_completes_on_another_worker_with_the_in_process_stream(
    url: str, fake: FakeOpenAI, database_url: str, pace_s: float | None
) -> None:
    graph_input = {"messages": [{"role": "user", "content": "weather in Oslo?"}]}
    expected = await in_process(fake, graph_input)
    fake.reset()
    # The killed worker's model call never answers; its successor gets the answer.
    fake.script(MODEL, CALL, Reply(text="never", delay_s=60), ANSWER)
    client = get_client(url=url)
    env = worker_env_for(database_url, fake, **({} if pace_s is None else {"event_pace_s": pace_s}))
    async with (
        workers(env, 2) as (a, b),
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        tid, run = await _start(client, graph_input, MODES)
        async with asyncio.timeout(SLOW_S):
            while len(fake.served_for(MODEL)) < 2:  # noqa: ASYNC110 (served in another process)
                await asyncio.sleep(0.05)
        record = (await http.get(f"/api/runs/{run['run_id']}")).json()
        (a if _owns(a, record) else b).signal(signal.SIGKILL)
        values = await client.runs.join(tid, run["run_id"])
        parts = [p async for p in client.runs.join_stream(tid, run["run_id"])]
        events = (await http.get(f"/api/runs/{run['run_id']}/events")).text
    assert values["messages"][-1]["content"] == "Sunny in Oslo: walk to dinner."
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "success"
    assert parts[0].event == "metadata"
    served = [(x.reply.text, len(x.body["messages"])) for x in fake.served_for(MODEL)]
    got = normalise([[p.event, p.data] for p in parts[1:]])
    # pytest cuts a long diff: the message names each part, so a failure says which differ.
    why = f"served {served}; got {_outline(got)}; want {_outline(normalise(expected))}"
    assert got == normalise(expected), why
    assert events.count("event: run.started") == 2 and "lease expired" in events


def _outline(parts: list[Any]) -> list[str]:
    """Each stream part in a few words: its mode, the messages' types or the nodes updated."""
    out = []
    for mode, data in parts:
        if mode == "values" and isinstance(data, dict):
            out.append(f"values:{'/'.join(m.get('type', '?') for m in data.get('messages', []))}")
        elif mode == "updates" and isinstance(data, dict):
            out.append(f"updates:{'/'.join(data)}")
        else:
            out.append(f"{mode}:{str(data)[:40]}")
    return out


CHECKPOINT_MODES = ["values", "checkpoints", "debug"]


def _shape(mode: str, data: Any) -> tuple[Any, ...] | None:
    """What must match between two streams of one graph: ids and times differ."""
    if mode == "values":
        return (mode, len(data["messages"]))
    if mode == "checkpoints":
        return (mode, data["metadata"]["step"], tuple(data["next"]))
    if mode == "debug" and data["type"] == "checkpoint":
        return (mode, data["step"], tuple(data["payload"]["next"]))
    return None  # a task's debug part: a task run again after a crash is streamed again


async def test_kill_9_mid_run_streams_each_checkpoint_part_once(
    url: str, fake: FakeOpenAI, database_url: str
) -> None:
    """The part of the checkpoint resumed from is stored before the crash, and streamed again."""
    graph_input = {"messages": [{"role": "user", "content": "weather in Oslo?"}]}
    local = await in_process(fake, graph_input, CHECKPOINT_MODES)
    expected = [_shape(mode, data) for mode, data in local]
    fake.reset()
    fake.script(MODEL, CALL, Reply(text="never", delay_s=60), ANSWER)
    client = get_client(url=url)
    stored = (
        "SELECT count(*) FROM run_events WHERE run_id = %s AND type = 'graph.chunk'"
        " AND data ->> 'mode' = 'checkpoints' AND data -> 'data' -> 'next' = '[\"agent\"]'"
    )
    async with (
        workers(worker_env_for(database_url, fake), 2) as (a, b),
        httpx.AsyncClient(base_url=url, timeout=30) as http,
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) as db,
    ):
        tid, run = await _start(client, graph_input, CHECKPOINT_MODES)
        # Killed once the second model call is made and the part of the checkpoint it
        # resumes from (after the tool, next: agent) is stored.
        async with asyncio.timeout(SLOW_S):
            while len(fake.served_for(MODEL)) < 2 or (  # noqa: ASYNC110 (another process)
                await (await db.execute(stored, (run["run_id"],))).fetchone()
            ) != (2,):
                await asyncio.sleep(0.05)
        record = (await http.get(f"/api/runs/{run['run_id']}")).json()
        (a if _owns(a, record) else b).signal(signal.SIGKILL)
        await client.runs.join(tid, run["run_id"])
        parts = [p async for p in client.runs.join_stream(tid, run["run_id"])]
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "success"
    got = [_shape(p.event, p.data) for p in parts[1:]]
    assert [x for x in got if x] == [x for x in expected if x]


# Holds the first attempt's `run.completed` inside Postgres, after the graph's last checkpoint
# is stored: the worker is killed there, with the last `values` part still unstored.
_HOLD_THE_END = """
CREATE FUNCTION hold_the_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(600); RETURN NEW; END $$;
CREATE TRIGGER hold_the_end BEFORE INSERT ON run_events FOR EACH ROW
    WHEN (NEW.type = 'run.completed' AND NEW.attempt = 1) EXECUTE FUNCTION hold_the_end();
"""
_RELEASE_THE_END = """
DROP TRIGGER IF EXISTS hold_the_end ON run_events; DROP FUNCTION IF EXISTS hold_the_end();
"""


# The last checkpoint's parts: its `values`, and (streamed after it is stored, when LangGraph
# finds no next step) its `checkpoints` part and `debug` form.
@pytest.mark.parametrize("modes", [MODES, CHECKPOINT_MODES], ids=["values", "checkpoint-parts"])
async def test_kill_9_after_the_last_checkpoint_streams_the_final_parts_once(
    url: str, fake: FakeOpenAI, database_url: str, modes: list[str]
) -> None:
    graph_input = {"messages": [{"role": "user", "content": "weather in Oslo?"}]}
    expected = await in_process(fake, graph_input, modes)
    fake.reset()
    fake.script(MODEL, CALL, ANSWER)  # the graph runs to its end once: no model call after
    client = get_client(url=url)
    env = worker_env_for(database_url, fake, event_pace_s=600.0)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        await admin.execute(_HOLD_THE_END)
        try:
            async with (
                workers(env, 2) as (a, b),
                httpx.AsyncClient(base_url=url, timeout=30) as http,
            ):
                tid, run = await _start(client, graph_input, modes)
                held = (
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE wait_event = 'PgSleep' AND datname = current_database()"
                )
                async with asyncio.timeout(SLOW_S):
                    while not (pids := await (await admin.execute(held)).fetchall()):  # noqa: ASYNC110 (another process)
                        await asyncio.sleep(0.05)
                record = (await http.get(f"/api/runs/{run['run_id']}")).json()
                (a if _owns(a, record) else b).signal(signal.SIGKILL)
                for (pid,) in pids:  # its transaction, the end with the last part, rolls back
                    await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                values = await client.runs.join(tid, run["run_id"])
                parts = [p async for p in client.runs.join_stream(tid, run["run_id"])]
                events = (await http.get(f"/api/runs/{run['run_id']}/events")).text
        finally:
            await admin.execute(_RELEASE_THE_END)
    assert values["messages"][-1]["content"] == "Sunny in Oslo: walk to dinner."
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "success"
    assert len(fake.served_for(MODEL)) == 2  # the successor ran no step again
    if modes == MODES:
        assert normalise([[p.event, p.data] for p in parts[1:]]) == normalise(expected)
    else:  # ids and times differ between the two streams
        got = [_shape(p.event, p.data) for p in parts[1:]]
        assert got == [_shape(mode, data) for mode, data in expected]
    assert events.count("event: run.started") == 2 and "lease expired" in events


async def test_a_fresh_workers_first_priced_call_keeps_its_lease(
    url: str, fake: FakeOpenAI, database_url: str
) -> None:
    # Pricing the first call reads litellm's map, whose import takes seconds in a new process:
    # done on the event loop, it stopped the heartbeats longer than this lease, and the other
    # worker took the run over.
    fake.script(MODEL, CALL, ANSWER)
    env = worker_env_for(database_url, fake)
    env["AGENTRT_LEASE_SECONDS"] = "2.0"
    client = get_client(url=url)
    async with workers(env, 2), httpx.AsyncClient(base_url=url, timeout=30) as http:
        tid = (await client.threads.create())["thread_id"]
        graph_input = {"messages": [{"role": "user", "content": "weather in Oslo?"}]}
        run = await client.runs.create(
            tid, "tool_agent", input=graph_input, context={"model": MODEL}
        )
        values = await client.runs.join(tid, run["run_id"])
        events = (await http.get(f"/api/runs/{run['run_id']}/events")).text
    assert values["messages"][-1]["content"] == "Sunny in Oslo: walk to dinner."
    assert events.count("event: run.started") == 1, "the run lost its lease mid-attempt"
    assert "event: usage" in events


async def test_a_cron_polled_by_two_workers_fires_once_per_due_time(
    url: str, fake: FakeOpenAI, database_url: str, pool: Pool
) -> None:
    fake.script("m-cron", *[Reply(text=f"tick {n}") for n in range(40)])
    client = get_client(url=url)
    async with workers(worker_env_for(database_url, fake), 2) as (a, b):
        cron = await client.crons.create(
            "tool_agent",
            schedule="* * * * * */2",  # every 2 s (seconds last)
            input={"messages": [{"role": "user", "content": "tick"}]},
            context={"model": "m-cron"},
            on_run_completed="keep",  # its runs are counted below
        )
        async with asyncio.timeout(SLOW_S):
            while len(await _firings(pool, cron["cron_id"])) < 4:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
        await client.crons.update(cron["cron_id"], enabled=False)
        async with asyncio.timeout(SLOW_S):  # a firing claimed before that gets its run
            while None in (await _firings(pool, cron["cron_id"])).values():  # noqa: ASYNC110
                await asyncio.sleep(0.2)
        firings = await _firings(pool, cron["cron_id"])
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id FROM runs WHERE options -> 'langgraph' -> 'metadata' ->> 'cron_id' = %s",
                (cron["cron_id"],),
            )
            runs = [r["id"] for r in await cur.fetchall()]
        output = "\n".join(a.output + b.output)
    assert sorted(runs) == sorted(firings.values())
    # Each firing is a due time of the schedule (missed ones collapse into the next).
    due = sorted(firings)
    assert len(due) >= 4 and all(d.second % 2 == 0 and d.microsecond == 0 for d in due), due
    assert "a poll failed" not in output and "could not be created" not in output


async def _firings(pool: Pool, cron_id: str) -> dict[Any, str | None]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT due_at, run_id FROM lg_cron_firings WHERE cron_id = %s", (cron_id,)
        )
        return {r["due_at"]: r["run_id"] for r in await cur.fetchall()}
