"""A conversation far over the model's window: what the model received, and the manifest."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from nodes.context.tokens import counter_for
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.fake_openai import FakeOpenAI, FakeToolCall, Reply, usage_block
from tests.support.live import read_sse, serve

pytestmark = pytest.mark.timeout(300)

WINDOW, RESERVE = 3_000, 500
PROFILE = {
    "name": "support",
    "instructions": "You are the support agent of Acme. Answer briefly.",
    "model": "openai:gpt-4o-mini",
    "tools": ["calculator"],
    "context": {
        "window": WINDOW,
        "reserveOutputTokens": RESERVE,
        "maxItemTokens": 600,
        "summary": {"enabled": True, "model": "openai:summarizer", "maxTokens": 200},
    },
}
WORDS = [
    "the",
    "parcel",
    "left",
    "the",
    "depot",
    "on",
    "monday",
    "and",
    "should",
    "arrive",
    "before",
    "the",
    "weekend",
]


def prose(tag: str, words: int) -> str:
    return tag + " " + " ".join(WORDS[i % len(WORDS)] for i in range(words))


@pytest.fixture(scope="module")
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
async def client(settings: Settings, fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    configured = settings.model_copy(
        update={
            "openai_api_key": SecretStr("test-key"),
            "openai_base_url": fake.url,
            "model_ttft_timeout_s": 30.0,
            "model_timeout_s": 60.0,
        }
    )
    app = create_app(configured, models=ModelRegistry(configured))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


async def turn(client: httpx.AsyncClient, fake: FakeOpenAI, conv: str, n: int) -> dict[str, Any]:
    """One run: the model calls the calculator, then answers at length."""
    fake.script(
        "gpt-4o-mini",
        Reply(
            text="",
            tool_calls=[FakeToolCall("calculator", {"expression": f"{n}*7"}, id=f"call_{n}")],
            usage=usage_block(100, 10),
        ),
        Reply(text=prose(f"answer {n}:", 60), usage=usage_block(100, 60)),
    )
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": prose(f"message {n}:", 150)}
    )
    assert response.status_code == 202, response.text
    run = dict(response.json())
    events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed", events[-1].data
    run["events"] = events
    return run


def request_tokens(body: dict[str, Any]) -> int:
    """Count what the fake received with the model's tokenizer, independently of the engine."""
    counter = counter_for("gpt-4o-mini")
    total = counter.count(json.dumps(body.get("tools", [])))
    for m in body["messages"]:
        total += 4 + counter.count(m.get("content") or "")
        for call in m.get("tool_calls") or []:
            total += counter.count(call["function"]["name"] + call["function"]["arguments"])
    return total


def assert_whole_tool_pairs(messages: list[dict[str, Any]]) -> None:
    called = [c["id"] for m in messages for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert called and called == answered
    for index, m in enumerate(messages):
        if m["role"] == "tool":  # its call is the message right before it
            assert messages[index - 1]["tool_calls"][0]["id"] == m["tool_call_id"]


async def test_a_conversation_over_the_window_is_trimmed_summarised_and_the_summary_reused(
    client: httpx.AsyncClient, fake: FakeOpenAI, pool: Pool
) -> None:
    assert (await client.post("/api/agents", json=PROFILE)).status_code == 201
    conv = (await client.post("/api/conversations", json={"agent": "support"})).json()
    conv_id = conv["conversationId"]
    fake.script("summarizer", Reply(text="SUMMARY-ALPHA: the user tracks a parcel."))

    runs = []
    for n in range(1, 16):
        runs.append(await turn(client, fake, conv_id, n))
        if fake.served_for("summarizer"):
            break
    [summarising] = fake.served_for("summarizer")
    run = runs[-1]
    assert len(runs) > 3  # the first runs fit whole

    # What the summary model was asked: the oldest messages, not the recent ones.
    prompt = summarising.body["messages"][-1]["content"]
    assert "message 1:" in prompt and f"message {len(runs)}:" not in prompt

    # What the answering model received on the run's last call.
    last = fake.served_for("gpt-4o-mini")[-1].body
    messages = last["messages"]
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("You are the support agent of Acme.")
    assert "SUMMARY-ALPHA: the user tracks a parcel." in messages[0]["content"]
    assert sum(m["role"] == "system" for m in messages) == 1
    user = [m for m in messages if m["role"] == "user"]
    assert user[-1]["content"] == prose(f"message {len(runs)}:", 150)
    assert "message 1:" not in json.dumps(messages)
    assert_whole_tool_pairs(messages[1:])
    assert request_tokens(last) <= WINDOW - RESERVE

    # The manifest of each call says what happened.
    view = (await client.get(f"/api/runs/{run['runId']}/context")).json()
    assert view["agent"] == {"name": "support", "version": 1}
    first, second = view["manifests"]
    assert (first["step"], second["step"]) == (1, 2)
    summary = first["summary"]
    assert summary["created"] is True and summary["model"] == "openai:summarizer"
    [dropped] = first["dropped"]
    assert dropped["section"] == "history" and dropped["summarised"] is True
    assert dropped["messages"] == summary["covers"] and dropped["fromMessageId"]
    assert first["window"] == WINDOW and first["reserveOutputTokens"] == RESERVE
    assert first["tokenizer"] == "tiktoken:o200k_base"
    assert first["totalTokens"] <= first["available"]
    assert first["profile"] == {"name": "support", "version": 1}
    assert first["tools"] == ["calculator"]
    assert [s["name"] for s in first["sections"]] == [
        "instructions",
        "identity",
        "summary",
        "history",
        "current",
    ]
    assert second["summary"]["reused"] is True  # the run's second call: no new summary
    streamed = [e.data["data"].get("text", "") for e in run["events"] if "item" in e.event]
    assert not any("SUMMARY-ALPHA" in text for text in streamed)  # not part of the answer
    built = [e for e in run["events"] if e.event == "context.built"]
    assert [e.data["data"]["step"] for e in built] == [1, 2]

    # The summary's model call is in the usage ledger and the trace like any other.
    calls = (await client.get(f"/api/runs/{run['runId']}/usage")).json()["calls"]
    assert [c["model"] for c in calls].count("summarizer") == 1
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT attributes FROM trace_spans WHERE run_id = %s AND name = 'model.call'"
            " ORDER BY start_time",
            (run["runId"],),
        )
        spans = [r["attributes"] for r in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT covers, model FROM context_summaries WHERE conversation_id = %s", (conv_id,)
        )
        stored = await cur.fetchall()
    assert [s["agentrt.purpose"] for s in spans] == ["summary", "answer", "answer"]
    assert spans[1]["agentrt.context_url"] == (f"/api/runs/{run['runId']}/context?step=1&attempt=1")
    assert stored == [{"covers": summary["covers"], "model": "openai:summarizer"}]

    # The next run reuses the stored summary: no new summarising call.
    following = await turn(client, fake, conv_id, len(runs) + 1)
    assert len(fake.served_for("summarizer")) == 1
    again = (await client.get(f"/api/runs/{following['runId']}/context")).json()["manifests"]
    assert again[0]["summary"]["reused"] is True
    assert again[0]["summary"]["covers"] == summary["covers"]
    assert "SUMMARY-ALPHA" in fake.served_for("gpt-4o-mini")[-1].body["messages"][0]["content"]
