"""When LangGraph API runs start and threads go: after_seconds, on_completion, ttl, crons.

Also who sees a thread (the tenant's visibility setting), the thread's join stream, and
cancels across the two APIs. Driven by the official SDK against a server whose sweep runs
often, so that expiries are observed within the tests' deadlines.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from tests.support.fake_openai import FakeOpenAI, Reply
from tests.support.live import serve

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 120


@pytest.fixture(scope="module")
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def model_env(fake: FakeOpenAI) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", f"{fake.url}/v1")
        env.setenv("OPENAI_API_KEY", "test-key")
        yield


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
    fake.script("m-gone", *[Reply(text=f"answer {n}") for n in range(4)])
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
    await until(lambda: gone(client, background["thread_id"]), "the background run's thread")
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
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT run_id FROM lg_cron_firings WHERE cron_id = %s AND run_id IS NOT NULL",
                (cron["cron_id"],),
            )
            return [r["run_id"] for r in await cur.fetchall()]

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


async def _at_least(read: Any, n: int) -> bool:
    return len(await read()) >= n


async def _is_zero(read: Any) -> bool:
    return bool(await read() == 0)
