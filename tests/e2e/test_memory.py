"""Long-term memory across conversations, with real worker processes and the fake OpenAI server.

The API runs in the test process without workers; runs and extraction jobs execute in
`agentrt worker` processes; chat, extraction and embeddings go to the fake OpenAI server, so
the real adapters run (embeddings through `POST /v1/embeddings`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.fake_openai import FakeOpenAI, FakeToolCall, Reply
from tests.support.live import read_sse, serve
from tests.support.processes import WorkerProcess, worker_env

pytestmark = pytest.mark.timeout(400)
SLOW_S = 150
PROFILE = {
    "name": "mem",
    "instructions": "You are a helpful assistant.",
    "model": "openai:chat",
    "tools": ["remember", "recall", "forget", "current_time"],
    "memory": {"mode": "auto", "extractionModel": "openai:extractor"},
}
MEMORY_SETTINGS = {
    "embedding_model": "openai:emb",
    "embedding_dims": 64,
    "memory_poll_seconds": 0.3,
    "memory_lease_seconds": 3.0,
    "lease_seconds": 2.0,
    "worker_poll_seconds": 0.5,
    "model_backoff_base_s": 0.05,
}


def save(*ops: dict[str, Any]) -> Reply:
    """The extraction model's answer: one `save_memories` call."""
    return Reply(text="", tool_calls=[FakeToolCall("save_memories", {"operations": list(ops)})])


@pytest.fixture(scope="module")
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def env(database_url: str, fake: FakeOpenAI) -> dict[str, str]:
    return worker_env(
        database_url, openai_api_key="test-key", openai_base_url=fake.url, **MEMORY_SETTINGS
    )


@pytest.fixture(scope="module")
async def base_url(settings: Settings, fake: FakeOpenAI) -> AsyncIterator[str]:
    api = settings.model_copy(
        update={
            "auth_enabled": True,
            "run_workers": False,
            "openai_api_key": SecretStr("test-key"),
            "openai_base_url": fake.url,
            **MEMORY_SETTINGS,
        }
    )
    async with serve(create_app(api, models=ModelRegistry(api))) as url:
        yield url


@pytest.fixture(scope="module")
async def keys(pool: Pool, base_url: str) -> dict[str, str]:
    return {
        "ann": await create_api_key(pool, "acme", "ann", ["admin"]),
        "bob": await create_api_key(pool, "acme", "bob", []),
        "eve": await create_api_key(pool, "globex", "ann", ["admin"]),
    }


def client(base_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


@pytest.fixture(scope="module")
async def profiles(base_url: str, keys: dict[str, str]) -> None:
    for who in ("ann", "eve"):
        async with client(base_url, keys[who]) as c:
            response = await c.post("/api/agents", json=PROFILE)
            assert response.status_code == 201, response.text


async def converse(c: httpx.AsyncClient, text: str) -> dict[str, Any]:
    conv = (await c.post("/api/conversations", json={"agent": "mem"})).json()["conversationId"]
    response = await c.post(f"/api/conversations/{conv}/messages", json={"content": text})
    assert response.status_code == 202, response.text
    run = dict(response.json())
    events = await read_sse(c, run["streamUrl"])
    assert events[-1].event == "run.completed", events[-1]
    return run


async def all_events(c: httpx.AsyncClient, run_id: str) -> list[Any]:
    """Every event of the run: the stream to `run.completed`, then what followed it."""
    events = await read_sse(c, f"/api/runs/{run_id}/events")
    after = {"Last-Event-ID": str(events[-1].id)}
    return events + await read_sse(c, f"/api/runs/{run_id}/events", headers=after)


async def memory_events(c: httpx.AsyncClient, run_id: str, count: int = 1) -> list[Any]:
    """Wait for the run's `memory.updated` events (they follow `run.completed`)."""
    async with asyncio.timeout(SLOW_S):
        while True:
            found = [e for e in await all_events(c, run_id) if e.event == "memory.updated"]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.2)


async def memories(c: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
    response = await c.get("/api/memories", params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["memories"])


async def jobs_settled(pool: Pool) -> None:
    """Wait until no extraction job is left to run."""
    async with asyncio.timeout(SLOW_S):
        while True:
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) AS n FROM memory_jobs WHERE status IN ('queued', 'running')"
                )
                row = await cur.fetchone()
            if row is not None and row["n"] == 0:
                return
            await asyncio.sleep(0.2)


def system_prompt(served: Any) -> str:
    return str(served.body["messages"][0]["content"])


async def test_a_preference_is_remembered_recalled_updated_and_forgotten_per_user(
    base_url: str,
    keys: dict[str, str],
    fake: FakeOpenAI,
    env: dict[str, str],
    pool: Pool,
    profiles: None,
) -> None:
    worker = await WorkerProcess(env).start()
    try:
        async with client(base_url, keys["ann"]) as ann:
            fake.script("chat", Reply(text="Noted, dark mode it is."))
            fake.script(
                "extractor",
                save(
                    {
                        "action": "add",
                        "text": "Prefers dark mode in every app",
                        "kind": "preference",
                        "reason": "stated a lasting preference",
                    }
                ),
            )
            first = await converse(ann, "I always want dark mode in every app I use.")
            (event,) = await memory_events(ann, first["runId"])
            assert event.data["data"]["counts"] == {"added": 1, "updated": 0, "removed": 0}
            (stored,) = await memories(ann, scope="user")
            assert stored["text"] == "Prefers dark mode in every app"
            assert stored["kind"] == "preference" and stored["sourceRunId"] == first["runId"]

            # A new conversation: the model's request carries it in the memory section.
            fake.script("chat", Reply(text="You like dark mode."))
            fake.script("extractor", save())
            second = await converse(ann, "Which app theme do I like, dark mode or light?")
            request = fake.served_for("chat")[-1]
            prompt = system_prompt(request)
            assert "<memory>" in prompt and "Prefers dark mode in every app" in prompt
            await memory_events(ann, second["runId"])
            manifest = (await ann.get(f"/api/runs/{second['runId']}/context")).json()
            section = next(
                s for s in manifest["manifests"][-1]["sections"] if s["name"] == "memory"
            )
            assert section["itemDetails"][0]["id"] == stored["id"]
            assert section["itemDetails"][0]["score"] > 0

            # A contradicting statement updates the item instead of adding a second one.
            fake.script("chat", Reply(text="Light mode from now on."))
            fake.script(
                "extractor",
                save(
                    {
                        "action": "update",
                        "ref": "m1",
                        "text": "Prefers light mode in every app",
                        "kind": "preference",
                        "reason": "changed their mind",
                    }
                ),
            )
            third = await converse(ann, "Actually I switched: light mode in every app now.")
            (event,) = await memory_events(ann, third["runId"])
            assert event.data["data"]["updated"][0]["previous"] == "Prefers dark mode in every app"
            (changed,) = await memories(ann, scope="user")
            assert changed["id"] == stored["id"] and changed["text"].startswith("Prefers light")

            # A second user of the tenant, and the same user id in another tenant, never see it.
            async with client(base_url, keys["bob"]) as bob:
                assert await memories(bob, q="light mode") == []
                denied = await bob.get("/api/memories", params={"userId": "ann"})
                assert denied.status_code == 403
                assert denied.json()["error"]["code"] == "forbidden"
                fake.script("chat", Reply(text="I don't know."))
                await converse(bob, "Which theme do I like, light mode?")
                assert "<memory>" not in system_prompt(fake.served_for("chat")[-1])
            async with client(base_url, keys["eve"]) as eve:
                assert await memories(eve, q="light mode") == []

            # `forget` removes it.
            fake.script(
                "chat",
                Reply(tool_calls=[FakeToolCall("forget", {"memory_id": stored["id"]})]),
                Reply(text="Forgotten."),
            )
            fake.script("extractor", save())
            await converse(ann, "Please forget my theme preference.")
            assert await memories(ann, scope="user") == []
            await jobs_settled(pool)
    finally:
        await worker.close()


async def test_killing_the_worker_during_extraction_loses_nothing_and_writes_nothing_twice(
    base_url: str,
    keys: dict[str, str],
    fake: FakeOpenAI,
    env: dict[str, str],
    pool: Pool,
    profiles: None,
) -> None:
    await jobs_settled(pool)
    fake.reset()
    async with client(base_url, keys["eve"]) as eve:
        first = await WorkerProcess(env).start()
        try:
            fake.script("chat", Reply(text="Got it."))
            fake.script(
                "extractor",
                save(
                    {"action": "add", "text": "Works at the Globex reactor", "kind": "fact"},
                    {"action": "add", "text": "Manages the HOLD-ME project", "kind": "fact"},
                ),
            )
            # The second memory's embedding never answers: the first is written, then the
            # worker is killed mid-job.
            fake.hold_embeddings = "HOLD-ME"
            run = await converse(eve, "I work at the Globex reactor and manage the big project.")
            async with asyncio.timeout(SLOW_S):
                while True:
                    held = [s for s in fake.served_for("emb") if "HOLD-ME" in str(s.body)]
                    if held:
                        break
                    await asyncio.sleep(0.1)
            written = await memories(eve, scope="user")
            assert [m["text"] for m in written] == ["Works at the Globex reactor"]
            first.signal(signal.SIGKILL)
            await first.wait()
        finally:
            await first.close()
        extractions = len(fake.served_for("extractor"))
        fake.hold_embeddings = None
        second = await WorkerProcess(env).start()
        try:
            (event,) = await memory_events(eve, run["runId"])
        finally:
            await second.close()
        # The saved decision was applied again: no second extraction call, no second item.
        assert len(fake.served_for("extractor")) == extractions
        texts = sorted(m["text"] for m in await memories(eve, scope="user"))
        assert texts == ["Manages the HOLD-ME project", "Works at the Globex reactor"]
        assert event.data["data"]["counts"]["added"] == 2
        events = await all_events(eve, run["runId"])
        usage = [e for e in events if e.event == "usage" and e.data["data"].get("purpose")]
        assert len(usage) == 1
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT status, attempts FROM memory_jobs WHERE run_id = %s", (run["runId"],)
            )
            job = await cur.fetchone()
        assert job is not None and job["status"] == "done" and job["attempts"] == 2
