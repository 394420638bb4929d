"""When LangGraph API runs start and threads go: after_seconds, on_completion, ttl, crons.

Also who sees a thread (the tenant's visibility setting), the thread's join stream, and
cancels across the two APIs. Driven by the official SDK against a server whose sweep runs
often, so that expiries are observed within the tests' deadlines.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from tests.support import langgraph_server
from tests.support.fake_openai import FakeOpenAI, Reply
from tests.support.live import serve

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 120


# The fake model server of the LangGraph tests (tests/support/langgraph_server.py).
fake = langgraph_server.fake
model_env = langgraph_server.model_env


@pytest.fixture(scope="module")
def app_settings(settings: Settings, fake: FakeOpenAI) -> Settings:
    return settings.model_copy(
        update={
            "langgraph_config": ROOT / "langgraph.json",
            "langgraph_sweep_s": 0.2,
            "langgraph_delete_grace_s": 0.5,
            "openai_base_url": f"{fake.url}/v1",
        }
    )


@pytest.fixture(scope="module")
async def url(app_settings: Settings, model_env: None) -> AsyncIterator[str]:
    async with serve(create_app(app_settings)) as base:
        yield base


@pytest.fixture
def client(url: str) -> LangGraphClient:
    return get_client(url=url)


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def until(check: Any, what: str) -> None:
    """Wait until `await check()` is truthy."""
    async with asyncio.timeout(SLOW_S):
        while not await check():  # noqa: ASYNC110 (state in another process's database)
            await asyncio.sleep(0.1)


async def gone(client: LangGraphClient, thread_id: str) -> bool:
    try:
        await client.threads.get(thread_id)
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code == 404
    return False


async def native(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await http.get(f"/api/runs/{run_id}")).json()
    return found


async def test_after_seconds_keeps_the_run_pending_until_its_time(
    client: LangGraphClient, fake: FakeOpenAI, url: str, pool: Pool
) -> None:
    fake.script("m-later", Reply(text="later"))
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(
        tid, "tool_agent", input=ask("hi"), context={"model": "m-later"}, after_seconds=3
    )
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        queued = await native(http, run["run_id"])
        assert queued["status"] == "queued" and queued["notBefore"] is not None
        not_before = datetime.fromisoformat(queued["notBefore"])
        created = datetime.fromisoformat(queued["createdAt"])
        assert 2.5 <= (not_before - created).total_seconds() <= 3.5
        assert (await client.runs.get(tid, run["run_id"]))["status"] == "pending"
        values = await client.runs.join(tid, run["run_id"])
        done = await native(http, run["run_id"])
    assert values["messages"][-1]["content"] == "later"
    assert datetime.fromisoformat(done["startedAt"]) >= not_before
    async with pool.connection() as conn:  # stored on the run, so a restart keeps it
        cur = await conn.execute("SELECT not_before FROM runs WHERE id = %s", (run["run_id"],))
        row = await cur.fetchone()
    assert row is not None and row["not_before"] == not_before


async def test_on_completion_delete_removes_a_stateless_runs_thread(
    client: LangGraphClient, fake: FakeOpenAI, pool: Pool
) -> None:
    fake.script("m-gone", *[Reply(text=f"answer {n}") for n in range(5)])
    context = {"model": "m-gone"}
    before = await _threads(pool)
    values = await client.runs.wait(
        None, "tool_agent", input=ask("one"), context=context, on_completion="delete"
    )
    assert values["messages"][-1]["content"] == "answer 0"  # delivered, then deleted
    assert await _threads(pool) == before
    streamed = [
        p
        async for p in client.runs.stream(
            None, "tool_agent", input=ask("two"), context=context, on_completion="delete"
        )
    ]
    assert streamed[-1].data["messages"][-1]["content"] == "answer 1"
    assert await _threads(pool) == before
    background = await client.runs.create(
        None, "tool_agent", input=ask("three"), context=context, on_completion="delete"
    )
    kept = await client.runs.create(
        None, "tool_agent", input=ask("four"), context=context, on_completion="keep"
    )
    unsaid = await client.runs.create(None, "tool_agent", input=ask("five"), context=context)
    await until(lambda: gone(client, background["thread_id"]), "the background run's thread")
    # LangGraph's default for a stateless run is `delete` too.
    await until(lambda: gone(client, unsaid["thread_id"]), "the thread of a run saying nothing")
    await client.runs.join(kept["thread_id"], kept["run_id"])
    await asyncio.sleep(1.5)  # several sweeps past the grace: the kept thread must stay
    assert (await client.threads.get(kept["thread_id"]))["status"] == "idle"


async def _threads(pool: Pool) -> set[str]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM conversations")
        return {r["id"] for r in await cur.fetchall()}


async def test_a_threads_ttl_deletes_it_and_each_read_pushes_it_back(
    client: LangGraphClient, pool: Pool
) -> None:
    tid = (await client.threads.create(ttl={"ttl": 0.05, "strategy": "delete"}))["thread_id"]
    first = (await client.threads.get(tid, include=["ttl"]))["ttl"]
    assert first["strategy"] == "delete" and first["ttl"] == 0.05
    await asyncio.sleep(0.2)
    second = (await client.threads.get(tid, include=["ttl"]))["ttl"]
    assert second["expires_at"] > first["expires_at"]  # the read refreshed it
    # Watched in the database: every read through the API would push the expiry back.
    await until(lambda: _missing(pool, tid), "the expired thread")
    other = (await client.threads.create())["thread_id"]
    assert (await client.threads.get(other, include=["ttl"]))["ttl"] is None
    await client.threads.update(other, metadata={"x": 1}, ttl=0.02)
    await until(lambda: _missing(pool, other), "the thread given a ttl by update")
    with pytest.raises(httpx.HTTPStatusError) as bad:
        await client.threads.create(ttl={"ttl": 5, "strategy": "keep_latest"})
    assert bad.value.response.status_code == 422


async def _missing(pool: Pool, thread_id: str) -> bool:
    return thread_id not in await _threads(pool)


async def test_a_store_items_ttl_deletes_it(client: LangGraphClient) -> None:
    await client.store.put_item(["default", "ttl"], "brief", {"text": "soon gone"}, ttl=0.02)
    await client.store.put_item(["default", "ttl"], "kept", {"text": "stays"})
    assert (await client.store.get_item(["default", "ttl"], "brief"))["value"]["text"]

    async def brief_gone() -> bool:
        try:
            await client.store.get_item(["default", "ttl"], "brief", refresh_ttl=False)
        except httpx.HTTPStatusError as exc:
            return exc.response.status_code == 404
        return False

    await until(brief_gone, "the expired store item")
    assert (await client.store.get_item(["default", "ttl"], "kept"))["value"] == {"text": "stays"}


async def test_a_cron_with_on_run_completed_delete_leaves_no_threads(
    client: LangGraphClient, fake: FakeOpenAI, pool: Pool
) -> None:
    fake.script("m-cron-del", *[Reply(text=f"tick {n}") for n in range(40)])
    cron = await client.crons.create(
        "tool_agent",
        schedule="* * * * * *",
        input=ask("tick"),
        context={"model": "m-cron-del"},
        on_run_completed="delete",
    )

    async def fired() -> list[str]:
        return await _fired_runs(pool, cron["cron_id"])

    await until(lambda: _at_least(fired, 2), "two firings")
    await client.crons.delete(cron["cron_id"])

    async def runs_left() -> int:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM runs"
                " WHERE options -> 'langgraph' -> 'metadata' ->> 'cron_id' = %s",
                (cron["cron_id"],),
            )
            row = await cur.fetchone()
        return int(row["n"]) if row else 0

    await until(lambda: _is_zero(runs_left), "the cron's threads (and their runs) deleted")


async def test_a_cron_on_an_assistant_created_through_the_api_runs_with_its_config(
    client: LangGraphClient, fake: FakeOpenAI, pool: Pool
) -> None:
    fake.script("m-cron-asst", *[Reply(text=f"as configured {n}") for n in range(40)])
    assistant = await client.assistants.create("tool_agent", context={"model": "m-cron-asst"})
    tid = (await client.threads.create())["thread_id"]
    cron = await client.crons.create_for_thread(
        tid, assistant["assistant_id"], schedule="* * * * * *", input=ask("tick")
    )
    assert cron["assistant_id"] == assistant["assistant_id"]
    found = await client.crons.search(assistant_id=assistant["assistant_id"])
    assert [c["cron_id"] for c in found] == [cron["cron_id"]]

    async def fired() -> list[str]:
        return await _fired_runs(pool, cron["cron_id"])

    await until(lambda: _at_least(fired, 1), "a firing")
    run_id = (await fired())[0]
    await client.crons.delete(cron["cron_id"])  # its firings go with it
    values = await client.runs.join(tid, run_id)
    run = await client.runs.get(tid, run_id)
    assert run["assistant_id"] == assistant["assistant_id"]
    assert values["messages"][-1]["content"].startswith("as configured")


async def test_deleting_an_assistant_deletes_its_crons(client: LangGraphClient) -> None:
    assistant = await client.assistants.create("tool_agent")
    other = await client.assistants.create("tool_agent")
    yearly = {"schedule": "0 0 1 1 *", "input": ask("new year")}
    gone_cron = await client.crons.create(assistant["assistant_id"], **yearly)
    kept_cron = await client.crons.create(other["assistant_id"], **yearly)
    await client.assistants.delete(assistant["assistant_id"])
    listed = {c["cron_id"] for c in await client.crons.search(limit=1000)}
    assert kept_cron["cron_id"] in listed
    assert gone_cron["cron_id"] not in listed
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await client.crons.delete(gone_cron["cron_id"])
    assert refused.value.response.status_code == 404


async def test_a_cron_whose_assistant_is_gone_when_it_fires_is_disabled(
    client: LangGraphClient, pool: Pool
) -> None:
    assistant = await client.assistants.create("tool_agent")
    cron = await client.crons.create(
        assistant["assistant_id"], schedule="* * * * * *", input=ask("tick")
    )
    # As if the assistant went between the cron's claim and its run's creation (the API's
    # delete takes the crons with it).
    async with pool.connection() as conn:
        await conn.execute(
            "DELETE FROM lg_assistants WHERE assistant_id = %s", (assistant["assistant_id"],)
        )

    async def state() -> tuple[bool, list[str]]:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT c.enabled, array_remove(array_agg(f.run_id), NULL) AS fired"
                " FROM lg_crons c LEFT JOIN lg_cron_firings f USING (cron_id)"
                " WHERE c.cron_id = %s GROUP BY c.enabled",
                (cron["cron_id"],),
            )
            row = await cur.fetchone()
        assert row is not None
        return bool(row["enabled"]), list(row["fired"])

    async def disabled() -> bool:
        return not (await state())[0]

    await until(disabled, "the cron disabled")
    _, fired = await state()
    assert len(fired) == 1 and fired[0].startswith("error:"), fired


@pytest.mark.parametrize(
    ("end_time", "stored"),
    [
        ("2030-01-01T12:00:00+17:03", "2029-12-31T18:57:00+00:00"),
        ("2030-01-01T12:00:00", "2030-01-01T12:00:00+00:00"),
        ("0001-01-01T00:00:00+05:00", None),
        ("9999-12-31T23:59:59-05:00", None),
    ],
)
async def test_a_crons_end_time_is_stored_in_utc_or_refused(
    url: str, end_time: str, stored: str | None
) -> None:
    body = {"assistant_id": "tool_agent", "schedule": "0 0 1 1 *", "end_time": end_time}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        created = await http.post("/runs/crons", json=body)
        if stored is None:  # before the calendar's first day or after its last, in UTC
            assert created.status_code == 422, created.text
            assert "out of range" in created.json()["error"]["message"]
            return
        assert created.status_code == 200, created.text
        cron = created.json()
        assert cron["end_time"] == stored
        patched = await http.patch(f"/runs/crons/{cron['cron_id']}", json=body)
        assert patched.status_code == 200, patched.text
        assert patched.json()["end_time"] == stored
        await http.delete(f"/runs/crons/{cron['cron_id']}")


async def _fired_runs(pool: Pool, cron_id: str) -> list[str]:
    """The runs a cron's firings started (a firing that failed records its error instead)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT run_id FROM lg_cron_firings WHERE cron_id = %s AND run_id LIKE 'run%%'",
            (cron_id,),
        )
        return [r["run_id"] for r in await cur.fetchall()]


async def _at_least(read: Any, n: int) -> bool:
    return len(await read()) >= n


async def _is_zero(read: Any) -> bool:
    return bool(await read() == 0)


@pytest.fixture(scope="module")
async def keyed_url(app_settings: Settings, model_env: None) -> AsyncIterator[str]:
    secured = app_settings.model_copy(
        update={"auth_enabled": True, "langgraph_thread_visibility": {"support": "tenant"}}
    )
    async with serve(create_app(secured)) as base:
        yield base


TEAMS = (("support", "ann"), ("support", "ben"), ("acme", "cat"), ("acme", "dan"))


async def test_a_tenant_setting_shows_every_users_threads_to_the_whole_tenant(
    keyed_url: str, pool: Pool
) -> None:
    def as_user(key: str) -> LangGraphClient:
        return get_client(url=keyed_url, api_key=None, headers={"Authorization": f"Bearer {key}"})

    users = {n: as_user(await create_api_key(pool, t, n, [])) for t, n in TEAMS}
    ann, ben, cat, dan = (users[n] for n in ("ann", "ben", "cat", "dan"))
    shared = (await ann.threads.create(metadata={"ticket": "T-1"}))["thread_id"]
    private = (await cat.threads.create())["thread_id"]
    assert [t["thread_id"] for t in await ben.threads.search()] == [shared]
    assert (await ben.threads.get(shared))["metadata"]["ticket"] == "T-1"
    await ben.threads.update(shared, metadata={"handled_by": "ben"})
    assert await dan.threads.search() == []  # acme keeps the default: owner only
    with pytest.raises(httpx.HTTPStatusError) as hidden:
        await dan.threads.get(private)
    assert hidden.value.response.status_code == 404
    with pytest.raises(httpx.HTTPStatusError) as other_tenant:
        await ben.threads.get(private)
    assert other_tenant.value.response.status_code == 404


async def test_a_threads_join_stream_follows_its_runs_and_resumes_after_last_event_id(
    client: LangGraphClient, fake: FakeOpenAI
) -> None:
    fake.script("m-thread", Reply(text="first answer"), Reply(text="second answer"))
    tid = (await client.threads.create())["thread_id"]
    context, modes = {"model": "m-thread"}, ["values", "updates"]
    seen: list[Any] = []
    two_done = asyncio.Event()

    async def follow() -> None:
        async for part in await client.threads.join_stream(tid):  # a coroutine in the SDK
            seen.append(part)
            if sum(p.event == "run_done" for p in seen) == 2:
                two_done.set()
                return

    follower = asyncio.create_task(follow())
    first = await client.runs.create(tid, "tool_agent", input=ask("1"), context=context)
    await client.runs.join(tid, first["run_id"])
    second = await client.runs.create(
        tid, "tool_agent", input=ask("2"), context=context, stream_mode=modes
    )
    async with asyncio.timeout(SLOW_S):
        await two_done.wait()
    await follower
    runs = [first["run_id"], second["run_id"]]
    done = [p.data for p in seen if p.event == "run_done"]
    assert done == [{"run_id": r, "status": "success"} for r in runs]
    assert [p.data["run_id"] for p in seen if p.event == "metadata"] == runs
    # Each run's parts are those its own join stream gives, their ids naming the run (the SDK
    # gives `metadata`, which has none, the id before it, as SSE clients do).
    for run_id in runs:
        own = [p for p in await _parts(client.runs.join_stream(tid, run_id)) if _part(p)]
        mine = [p for p in seen if _part(p) and p.id.startswith(f"{run_id}:")]
        assert [(p.event, p.data) for p in mine] == [(p.event, p.data) for p in own]
        assert [p.id for p in mine] == [f"{run_id}:{p.id}" for p in own]
    # A reconnect after the first run's second part gets exactly what followed it.
    cut = [p for p in seen if _part(p)][1]
    rest: list[Any] = []
    async for part in await client.threads.join_stream(tid, last_event_id=cut.id):
        rest.append(part)
        if part.event == "run_done" and part.data["run_id"] == runs[1]:
            break
    after = seen[seen.index(cut) + 1 :]
    assert [(p.event, p.data) for p in rest] == [(p.event, p.data) for p in after]
    assert [p.id for p in rest if _part(p)] == [p.id for p in after if _part(p)]
    with pytest.raises(httpx.HTTPStatusError) as bad:
        await _parts(await client.threads.join_stream(tid, stream_mode="state_update"))
    assert bad.value.response.status_code == 422


def _part(part: Any) -> bool:
    """Say whether a stream part is a run's part (not `metadata` or `run_done`)."""
    return bool(part.id) and part.event not in ("metadata", "run_done")


async def _parts(stream: AsyncIterator[Any]) -> list[Any]:
    return [p async for p in stream]


async def test_a_cancel_through_either_api_stops_a_run_of_the_other(
    client: LangGraphClient, fake: FakeOpenAI, url: str
) -> None:
    fake.script("m-slow-lg", Reply(text="never", delay_s=60))
    fake.script("m-slow-native", Reply(text="never", delay_s=60))
    tid = (await client.threads.create())["thread_id"]
    lg_run = await client.runs.create(
        tid, "tool_agent", input=ask("slow"), context={"model": "m-slow-lg"}
    )
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await until(lambda: _native_status(http, lg_run["run_id"], "running"), "LG run running")
        cancelled = await http.post(f"/api/runs/{lg_run['run_id']}/cancel")
        assert cancelled.status_code == 202
        await client.runs.join(tid, lg_run["run_id"])
        assert (await client.runs.get(tid, lg_run["run_id"]))["status"] == "interrupted"
        posted = await http.post(
            f"/api/conversations/{tid}/messages",
            json={"content": "slow too", "model": "openai:m-slow-native"},
        )
        native_id = posted.json()["runId"]
        await until(lambda: _native_status(http, native_id, "running"), "native run running")
        await client.runs.cancel(tid, native_id, wait=True)
        assert (await native(http, native_id))["status"] == "cancelled"
        assert (await client.runs.get(tid, native_id))["status"] == "interrupted"
        # One path: both ended with the same `run.cancelled` event of the native log.
        for run_id in (lg_run["run_id"], native_id):
            log = (await http.get(f"/api/runs/{run_id}/events")).text
            assert log.count("event: run.cancelled") == 1, log[-500:]
            assert (await native(http, run_id))["status"] == "cancelled"


async def _native_status(http: httpx.AsyncClient, run_id: str, want: str) -> bool:
    return bool((await native(http, run_id))["status"] == want)


async def test_a_thread_is_created_with_supersteps_applied(client: LangGraphClient) -> None:
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    thread = await client.threads.create(
        graph_id="tool_agent",
        supersteps=[
            {"updates": [{"values": {"messages": said[:1]}, "as_node": "agent"}]},
            {"updates": [{"values": {"messages": said[1:]}, "as_node": "agent"}]},
        ],
    )
    state = await client.threads.get_state(thread["thread_id"])
    assert [m["content"] for m in state["values"]["messages"]] == ["hi", "hello"]
    history = await client.threads.get_history(thread["thread_id"])
    assert [h["metadata"]["source"] for h in history][:2] == ["update", "update"]
    with pytest.raises(httpx.HTTPStatusError) as bad:
        await client.threads.create(
            graph_id="tool_agent",
            supersteps=[{"updates": [{"values": {}, "as_node": "no_such_node"}]}],
        )
    assert bad.value.response.status_code == 422
    with pytest.raises(httpx.HTTPStatusError) as missing:
        await client.threads.update_state(
            thread["thread_id"],
            {"messages": said[:1]},
            checkpoint={"checkpoint_ns": "no_such_subgraph:1"},
        )
    assert missing.value.response.status_code == 422
    assert missing.value.response.json()["error"]["code"] == "unknown_reference"
    assert "no_such_subgraph" in missing.value.response.json()["error"]["message"]


async def test_a_deleted_threads_webhook_is_still_delivered_with_its_values(
    client: LangGraphClient, fake: FakeOpenAI, pool: Pool, app_settings: Settings
) -> None:
    received: list[dict[str, Any]] = []
    arrived = asyncio.Event()
    receiver = FastAPI()
    receiver.state.settings = app_settings

    @receiver.post("/hook")
    async def hook(request: Request) -> Response:
        received.append(await request.json())
        arrived.set()
        return Response(status_code=503 if len(received) == 1 else 204)

    fake.script("m-hook-gone", Reply(text="done"))
    before = await _threads(pool)
    async with serve(receiver) as hook_url:
        values = await client.runs.wait(
            None,
            "tool_agent",
            input=ask("hello"),
            context={"model": "m-hook-gone"},
            on_completion="delete",
            webhook=f"{hook_url}/hook",
        )
        async with asyncio.timeout(SLOW_S):
            while len(received) < 2:
                arrived.clear()
                await arrived.wait()
    assert values["messages"][-1]["content"] == "done"
    assert [r["status"] for r in received] == ["success", "success"]
    assert received[-1]["values"]["messages"][-1]["content"] == "done"
    await until(lambda: _same(_threads(pool), before), "the thread deleted after the webhook")


async def _same(now: Any, before: set[str]) -> bool:
    return bool(await now == before)
