"""Knowledge bases and RAG with real worker processes and the fake OpenAI server.

The API runs in the test process without workers; ingestion and runs execute in `agentrt
worker` processes; chat and embeddings go to the fake OpenAI server (embeddings through
`POST /v1/embeddings`), so the real adapters run.
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
KNOWLEDGE_SETTINGS = {
    "embedding_model": "openai:emb",
    "embedding_dims": 64,
    "knowledge_poll_seconds": 0.3,
    "knowledge_lease_seconds": 3.0,
    "knowledge_batch_size": 2,
    "lease_seconds": 2.0,
    "worker_poll_seconds": 0.5,
    "model_backoff_base_s": 0.05,
}
HANDBOOK = """# Travel policy

## Booking

Employees book flights through the Skyways portal at least fourteen days ahead.

## Expenses

Hotel costs are refunded up to 180 euros a night in Paris and 120 euros elsewhere.
"""


def profile(name: str, mode: str = "auto") -> dict[str, Any]:
    return {
        "name": name,
        "instructions": "Answer from the company's documents.",
        "model": "openai:chat",
        "tools": ["search_knowledge"],
        "knowledge": {"mode": mode, "topK": 3},
    }


@pytest.fixture(scope="module")
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def env(database_url: str, fake: FakeOpenAI) -> dict[str, str]:
    return worker_env(
        database_url, openai_api_key="test-key", openai_base_url=fake.url, **KNOWLEDGE_SETTINGS
    )


@pytest.fixture(scope="module")
async def base_url(settings: Settings, fake: FakeOpenAI) -> AsyncIterator[str]:
    api = settings.model_copy(
        update={
            "auth_enabled": True,
            "run_workers": False,
            "openai_api_key": SecretStr("test-key"),
            "openai_base_url": fake.url,
            **KNOWLEDGE_SETTINGS,
        }
    )
    async with serve(create_app(api, models=ModelRegistry(api))) as url:
        yield url


@pytest.fixture(scope="module")
async def keys(pool: Pool, base_url: str) -> dict[str, str]:
    return {
        "ann": await create_api_key(pool, "acme", "ann", ["admin"]),
        "eve": await create_api_key(pool, "globex", "eve", ["admin"]),
    }


def client(base_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


async def upload(c: httpx.AsyncClient, kb: str, name: str, text: str) -> dict[str, Any]:
    response = await c.post(
        f"/api/knowledge-bases/{kb}/documents",
        files={"file": (name, text.encode(), "text/markdown")},
        data={"title": name.removesuffix(".md").title()},
    )
    assert response.status_code == 202, response.text
    return dict(response.json())


async def until_ready(c: httpx.AsyncClient, kb: str, doc_id: str) -> dict[str, Any]:
    async with asyncio.timeout(SLOW_S):
        while True:
            doc = (await c.get(f"/api/knowledge-bases/{kb}/documents/{doc_id}")).json()
            assert doc["status"] != "failed", doc
            if doc["status"] == "ready":
                return dict(doc)
            await asyncio.sleep(0.2)


async def converse(c: httpx.AsyncClient, agent: str, text: str) -> dict[str, Any]:
    conv = (await c.post("/api/conversations", json={"agent": agent})).json()["conversationId"]
    response = await c.post(f"/api/conversations/{conv}/messages", json={"content": text})
    assert response.status_code == 202, response.text
    run = dict(response.json())
    events = await read_sse(c, run["streamUrl"])
    assert events[-1].event == "run.completed", events[-1]
    return {**run, "events": events}


def system_prompt(served: Any) -> str:
    return str(served.body["messages"][0]["content"])


def find_spans(span: dict[str, Any], name: str) -> list[dict[str, Any]]:
    found = [span] if span["name"] == name else []
    for child in span["children"]:
        found += find_spans(child, name)
    return found


async def test_a_document_is_ingested_found_by_tool_and_section_cited_and_in_the_evidence(
    base_url: str, keys: dict[str, str], fake: FakeOpenAI, env: dict[str, str]
) -> None:
    worker = await WorkerProcess(env).start()
    try:
        async with client(base_url, keys["ann"]) as ann:
            created = await ann.post(
                "/api/knowledge-bases",
                json={"name": "handbook", "access": {"profiles": ["helper"]}},
            )
            assert created.status_code == 201, created.text
            rewriting = {k: v for k, v in profile("helper").items() if k != "name"}
            rewriting["knowledge"] = {"mode": "auto", "rewriteModel": "openai:rewriter"}
            for body in (profile("helper"), profile("outsider")):
                response = await ann.post("/api/agents", json=body)
                assert response.status_code == 201, response.text
            doc = await upload(ann, "handbook", "handbook.md", HANDBOOK)
            ready = await until_ready(ann, "handbook", doc["id"])
            assert ready["progress"]["chunksDone"] == ready["progress"]["chunksTotal"] == 2
            found = await ann.post(
                "/api/knowledge-bases/handbook/search", json={"query": "hotel refund Paris"}
            )
            chunk = found.json()["results"][0]
            assert "180 euros" in chunk["text"] and chunk["title"] == "Handbook"
            marker = chunk["marker"]

            fake.script(
                "chat",
                Reply(tool_calls=[FakeToolCall("search_knowledge", {"query": "hotel Paris"})]),
                Reply(text=f"Up to 180 euros a night in Paris {marker}."),
            )
            run = await converse(ann, "helper", "How much hotel cost is refunded in Paris?")
            first, second = fake.served_for("chat")[-2:]
            # Automatic retrieval put the evidence into the first call's system prompt.
            assert "<knowledge>" in system_prompt(first) and marker in system_prompt(first)
            # The tool's result, with the same chunk, went into the second call.
            tool_message = next(m for m in second.body["messages"] if m["role"] == "tool")
            assert marker in tool_message["content"] and "Handbook" in tool_message["content"]
            kinds = [e.event for e in run["events"]]
            assert kinds.count("retrieval.completed") == 3  # auto, tool, auto

            evidence = (await ann.get(f"/api/runs/{run['runId']}/evidence")).json()
            modes = [(r["mode"], r["step"]) for r in evidence["retrievals"]]
            assert modes == [("auto", 1), ("tool", None), ("auto", 2)]
            auto = evidence["retrievals"][0]
            assert auto["chunks"][0]["chunkId"] == chunk["chunkId"]
            assert auto["chunks"][0]["rank"] == 1 and auto["chunks"][0]["score"] > 0
            assert chunk["chunkId"] in auto["inContext"]
            assert evidence["retrievals"][1]["toolCallId"]
            (citation,) = evidence["citations"]
            assert citation["resolved"] and citation["chunkId"] == chunk["chunkId"]
            assert citation["title"] == "Handbook" and citation["documentId"] == doc["id"]
            assert len(citation["retrievals"]) == 3

            async with asyncio.timeout(SLOW_S):
                while True:
                    trace = (await ann.get(f"/api/runs/{run['runId']}/trace")).json()
                    spans = find_spans(trace["root"], "retrieval")
                    if len(spans) >= 3:
                        break
                    await asyncio.sleep(0.3)
            assert spans[0]["attributes"]["agentrt.knowledge_bases"] == "handbook"

            # A rewrite model turns the message into the query; its call is in the ledger.
            changed = await ann.put("/api/agents/helper", json=rewriting)
            assert changed.status_code in (200, 201), changed.text
            fake.script("rewriter", Reply(text="hotel refund Paris"))
            fake.script("chat", Reply(text=f"180 euros {marker}."))
            rewritten = await converse(ann, "helper", "And what about those nights in Paris?")
            (record,) = (await ann.get(f"/api/runs/{rewritten['runId']}/evidence")).json()[
                "retrievals"
            ]
            assert record["rewrittenQuery"] == "hotel refund Paris"
            assert record["chunks"][0]["chunkId"] == chunk["chunkId"]
            assert "those nights in Paris" in str(fake.served_for("rewriter")[-1].body)
            usage = (await ann.get(f"/api/runs/{rewritten['runId']}/usage")).json()
            assert "rewriter" in str(usage), usage

            # A profile the access list does not name: nothing retrieved, the tool refused.
            fake.script(
                "chat",
                Reply(
                    tool_calls=[
                        FakeToolCall(
                            "search_knowledge", {"query": "hotel", "knowledge_base": "handbook"}
                        )
                    ]
                ),
                Reply(text="I cannot see the handbook."),
            )
            denied = await converse(ann, "outsider", "How much hotel cost is refunded in Paris?")
            first = fake.served_for("chat")[-2]
            assert "<knowledge>" not in system_prompt(first)
            assert "180 euros" not in str(fake.served_for("chat")[-1].body)
            failed = [e for e in denied["events"] if e.event == "tool.failed"]
            assert "may not search it" in failed[0].data["data"]["error"]
            records = (await ann.get(f"/api/runs/{denied['runId']}/evidence")).json()
            assert all(r["knowledgeBases"] == [] for r in records["retrievals"])
            assert all(r["chunks"] == [] for r in records["retrievals"])

        # Another tenant never sees or searches it, by API or through its agents.
        async with client(base_url, keys["eve"]) as eve:
            listed = (await eve.get("/api/knowledge-bases")).json()["knowledgeBases"]
            assert listed == []
            missing = await eve.get(f"/api/knowledge-bases/{created.json()['id']}")
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "knowledge_base_not_found"
            assert (await eve.get("/api/knowledge-bases/handbook/documents")).status_code == 404
            assert (await eve.get(f"/api/runs/{run['runId']}/evidence")).status_code == 404
            await eve.post("/api/agents", json=profile("helper"))
            fake.script(
                "chat",
                Reply(tool_calls=[FakeToolCall("search_knowledge", {"query": "hotel Paris"})]),
                Reply(text="Nothing found."),
            )
            theirs = await converse(eve, "helper", "How much hotel cost is refunded in Paris?")
            assert "<knowledge>" not in system_prompt(fake.served_for("chat")[-2])
            assert "180 euros" not in str(fake.served_for("chat")[-1].body)
            records = (await eve.get(f"/api/runs/{theirs['runId']}/evidence")).json()
            assert [r["knowledgeBases"] for r in records["retrievals"]] == [[], [], []]
    finally:
        await worker.close()


async def test_killing_the_worker_mid_ingestion_finishes_the_document_exactly_once(
    base_url: str, keys: dict[str, str], fake: FakeOpenAI, env: dict[str, str], pool: Pool
) -> None:
    sections = [f"## Part {i}\n\nParagraph {i} about topic number {i}." for i in range(10)]
    sections[6] = "## Part 6\n\nParagraph 6 mentions the HOLD-ME marker."
    text = "# Long manual\n\n" + "\n\n".join(sections)
    async with client(base_url, keys["ann"]) as ann:
        await ann.post("/api/knowledge-bases", json={"name": "manuals"})
        fake.hold_embeddings = "HOLD-ME"
        first = await WorkerProcess(env).start()
        try:
            doc = await upload(ann, "manuals", "manual.md", text)
            async with asyncio.timeout(SLOW_S):
                while True:
                    if any("HOLD-ME" in str(s.body) for s in fake.served_for("emb")):
                        break
                    await asyncio.sleep(0.1)
            midway = (await ann.get(f"/api/knowledge-bases/manuals/documents/{doc['id']}")).json()
            assert midway["status"] == "processing"
            assert 0 < midway["progress"]["chunksDone"] < midway["progress"]["chunksTotal"] == 10
            first.signal(signal.SIGKILL)
            await first.wait()
        finally:
            await first.close()
        fake.hold_embeddings = None
        second = await WorkerProcess(env).start()
        try:
            ready = await until_ready(ann, "manuals", doc["id"])
        finally:
            await second.close()
    assert ready["attempts"] == 2 and ready["progress"]["chunksDone"] == 10
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n, count(DISTINCT position) AS positions FROM kb_chunks"
            " WHERE document_id = %s",
            (doc["id"],),
        )
        counts = await cur.fetchone()
    assert counts == {"n": 10, "positions": 10}
    # The batches stored before the kill were embedded once; only the held one twice.
    embedded: dict[str, int] = {}
    for served in fake.served_for("emb"):
        for item in served.body.get("input", []):
            if "Long manual" in item:
                embedded[item] = embedded.get(item, 0) + 1
    assert len(embedded) == 10
    assert sorted(embedded.values()) == [1] * 8 + [2] * 2
