"""Runs on real providers (the fake OpenAI server): ledger, costs, faults, budgets, routing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from nodes.models.usage import TokenUsage
from server.app import create_app
from server.db.pool import Pool
from server.settings import ModelPrice, RouteRule, Settings
from server.usage.pricing import cost_of, load_litellm
from server.usage.registry import ModelRegistry
from tests.support.fake_openai import (
    FakeOpenAI,
    FakeToolCall,
    Reply,
    Served,
    server_error,
    usage_block,
)
from tests.support.live import SseEvent, read_sse, rebuild_output, serve

LLAMA_PRICE = ModelPrice(
    input_per_mtok=Decimal("0.20"),
    output_per_mtok=Decimal("0.60"),
    cached_input_per_mtok=Decimal("0.05"),
)


@pytest.fixture(scope="module")
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def model_settings(settings: Settings, fake: FakeOpenAI) -> Settings:
    return settings.model_copy(
        update={
            "openai_api_key": SecretStr("test-key"),
            "openai_base_url": fake.url,
            "litellm_enabled": True,
            "litellm_api_base": fake.url,
            "litellm_api_key": SecretStr("test-key"),
            "model_backoff_base_s": 0.01,
            "model_backoff_max_s": 0.02,
            "model_ttft_timeout_s": 30.0,  # generous: a loaded machine must not time out a reply
            "model_timeout_s": 60.0,
            "breaker_failure_threshold": 3,
            "breaker_cooldown_s": 600.0,
            "model_prices": {"openai:my-llama": LLAMA_PRICE},
            "model_fallbacks": {"openai:primary": ["openai:backup"]},
            "model_routes": [
                RouteRule(model="openai:thinker", needs=["reasoning"]),
                RouteRule(model="openai:big", min_chars=200),
            ],
        }
    )


@pytest.fixture(scope="module")
async def base_url(model_settings: Settings) -> AsyncIterator[str]:
    app = create_app(model_settings, models=ModelRegistry(model_settings))
    async with serve(app) as url:
        yield url


@pytest.fixture
async def client(base_url: str, fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    fake.reset()
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as c:
        yield c


async def start(client: httpx.AsyncClient, content: str, **body: Any) -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()
    response = await client.post(
        f"/api/conversations/{conv['conversationId']}/messages", json={"content": content, **body}
    )
    assert response.status_code == 202, response.text
    return dict(response.json())


async def run_to_end(
    client: httpx.AsyncClient, content: str, **body: Any
) -> tuple[dict[str, Any], list[SseEvent]]:
    accepted = await start(client, content, **body)
    events = await read_sse(client, accepted["streamUrl"])
    return accepted, events


def litellm_cost(model: str, served: Served) -> Decimal:
    """The cost the run must report, from the usage the fake sent and litellm's prices."""
    info = load_litellm(Settings(_env_file=None)).model_cost[model]  # type: ignore[call-arg]
    assert served.usage is not None
    usage = TokenUsage(
        input_tokens=served.usage["prompt"],
        output_tokens=served.usage["completion"],
        cached_input_tokens=served.usage["cached"],
        reported=True,
    )
    return cost_of(
        usage,
        Decimal(str(info["input_cost_per_token"])),
        Decimal(str(info["output_cost_per_token"])),
        Decimal(str(info["cache_read_input_token_cost"])),
    )


async def test_two_model_calls_and_a_tool_call_make_two_ledger_rows_at_the_known_price(
    client: httpx.AsyncClient, fake: FakeOpenAI, pool: Pool
) -> None:
    fake.script(
        "gpt-4o-mini",
        Reply(
            text="Let me compute.",
            tool_calls=[FakeToolCall("calculator", {"expression": "6*7"})],
            usage=usage_block(prompt=200, completion=20, cached=128),
        ),
        Reply(text="It is 42.", usage=usage_block(prompt=260, completion=8)),
    )
    accepted, events = await run_to_end(client, "what is 6*7?", model="openai:gpt-4o-mini")

    assert events[-1].event == "run.completed", events[-1].data
    assert rebuild_output(events) == "Let me compute.\n\nIt is 42."
    served = fake.served_for("gpt-4o-mini")
    assert len(served) == 2
    expected = [litellm_cost("gpt-4o-mini", s) for s in served]

    usage = (await client.get(f"/api/runs/{accepted['runId']}/usage")).json()
    calls = usage["calls"]
    assert len(calls) == 2
    for row, sent, cost in zip(calls, served, expected, strict=True):
        assert row["provider"] == "openai" and row["model"] == "gpt-4o-mini"
        assert row["status"] == "ok" and row["priceSource"] == "litellm"
        assert row["inputTokens"] == sent.usage["prompt"]  # type: ignore[index]
        assert row["outputTokens"] == sent.usage["completion"]  # type: ignore[index]
        assert row["cachedInputTokens"] == sent.usage["cached"]  # type: ignore[index]
        assert Decimal(row["cost"]) == cost
        assert row["ttftMs"] is not None and row["latencyMs"] >= row["ttftMs"]
    totals = usage["totals"]
    assert totals["inputTokens"] == 460 and totals["outputTokens"] == 28
    assert totals["cachedInputTokens"] == 128
    assert totals["modelCalls"] == 2 and totals["toolCalls"] == 1
    assert Decimal(totals["cost"]) == sum(expected)

    run = (await client.get(f"/api/runs/{accepted['runId']}")).json()
    assert run["usage"] == totals
    usage_events = [e.data["data"] for e in events if e.event == "usage"]
    assert len(usage_events) == 2 and usage_events[-1]["totals"] == totals
    completed = [e.data["data"] for e in events if e.event == "message.item.completed"]
    assert [c["model"] for c in completed] == ["openai:gpt-4o-mini"] * 2
    assert [c["finishReason"] for c in completed] == ["tool_calls", "stop"]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n, sum(cost) AS cost FROM model_calls WHERE run_id = %s",
            (accepted["runId"],),
        )
        row = await cur.fetchone()
    assert row is not None and row["n"] == 2 and row["cost"] == sum(expected)


async def test_settings_price_overrides_and_an_unknown_price_is_null_not_zero(
    client: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    fake.script("my-llama", Reply(text="self-hosted", usage=usage_block(1000, 500, cached=400)))
    accepted, events = await run_to_end(client, "hi", model="openai:my-llama")
    assert events[-1].event == "run.completed"
    [call] = (await client.get(f"/api/runs/{accepted['runId']}/usage")).json()["calls"]
    assert call["priceSource"] == "settings"
    # 600 input at 0.20/M + 400 cached at 0.05/M + 500 output at 0.60/M
    assert Decimal(call["cost"]) == Decimal("0.00044")

    fake.script("mystery", Reply(text="unpriced", usage=usage_block(10, 5)))
    accepted, events = await run_to_end(client, "hi", model="openai:mystery")
    usage = (await client.get(f"/api/runs/{accepted['runId']}/usage")).json()
    assert usage["calls"][0]["cost"] is None and usage["calls"][0]["priceSource"] is None
    assert usage["totals"]["cost"] is None
    assert usage["totals"]["knownCost"] == "0" and usage["totals"]["unpricedCalls"] == 1


async def test_litellm_provider_runs_and_is_priced_from_litellm_map(
    client: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    fake.script("gpt-4o-mini", Reply(text="via litellm", usage=usage_block(50, 10)))
    accepted, events = await run_to_end(client, "hi", model="litellm:openai/gpt-4o-mini")
    assert events[-1].event == "run.completed", events[-1].data
    assert rebuild_output(events) == "via litellm"
    [call] = (await client.get(f"/api/runs/{accepted['runId']}/usage")).json()["calls"]
    assert call["provider"] == "litellm" and call["model"] == "openai/gpt-4o-mini"
    [served] = fake.served_for("gpt-4o-mini")
    assert Decimal(call["cost"]) == litellm_cost("gpt-4o-mini", served)


async def test_final_model_failure_says_class_provider_model_attempts_and_status(
    client: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    fake.script("broken", server_error(502), server_error(502), server_error(502))
    accepted, events = await run_to_end(client, "hi", model="openai:broken")

    failed = events[-1]
    assert failed.event == "run.failed"
    data = failed.data["data"]
    assert data["errorType"] == "model_call_failed"
    assert (data["errorClass"], data["provider"], data["model"]) == (
        "server_error",
        "openai",
        "broken",
    )
    assert data["attempts"] == 3 and data["statusCode"] == 502
    assert "failed after 3 attempts" in data["message"]
    run = (await client.get(f"/api/runs/{accepted['runId']}")).json()
    assert run["status"] == "failed"
    assert run["error"]["type"] == "model_call_failed"
    assert run["error"]["attempts"] == 3 and run["error"]["statusCode"] == 502
    assert run["error"]["errorClass"] == "server_error" and run["error"]["provider"] == "openai"
    usage = (await client.get(f"/api/runs/{accepted['runId']}/usage")).json()
    assert [c["status"] for c in usage["calls"]] == ["failed"] * 3
    assert usage["totals"]["failedModelCalls"] == 3


async def test_retry_after_partial_output_supersedes_the_streamed_item(
    client: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    fake.script(
        "flaky",
        Reply(text="The first try breaks off here", chunk_chars=5, drop_after_chunks=3),
        Reply(text="The second try is whole."),
    )
    accepted, events = await run_to_end(client, "hi", model="openai:flaky")

    assert events[-1].event == "run.completed"
    created = [e.data["data"]["itemId"] for e in events if e.event == "message.item.created"]
    assert len(created) == 2
    closing = [e for e in events if e.event == "message.item.completed"]
    assert [c.data["data"]["status"] for c in closing] == ["superseded", "completed"]
    assert closing[0].data["data"]["itemId"] == created[0]
    assert closing[0].data["data"]["text"] == "The first try b"
    types = [e.event for e in events]
    assert types.index("model.retry") == types.index("message.item.completed") + 1
    assert rebuild_output(events) == "The second try is whole."
    snapshot = (await client.get(accepted["snapshotUrl"])).json()
    assert snapshot["output"] == "The second try is whole."
    assert [i["status"] for i in snapshot["items"]] == ["superseded", "completed"]


async def test_fallback_model_answers_and_the_ledger_says_which_served(
    client: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    fake.script("primary", server_error(), server_error(), server_error())
    fake.script("backup", Reply(text="backup answer"))
    accepted, events = await run_to_end(client, "hi", model="openai:primary")

    assert events[-1].event == "run.completed"
    fallback = next(e.data["data"] for e in events if e.event == "model.fallback")
    assert (fallback["fromModel"], fallback["toModel"]) == ("openai:primary", "openai:backup")
    calls = (await client.get(f"/api/runs/{accepted['runId']}/usage")).json()["calls"]
    assert [(c["modelId"], c["status"]) for c in calls] == [
        ("openai:primary", "failed"),
        ("openai:primary", "failed"),
        ("openai:primary", "failed"),
        ("openai:backup", "ok"),
    ]
    assert {c["requestedModel"] for c in calls} == {"openai:primary"}


async def test_open_circuit_is_visible_and_fails_the_next_run_fast(
    client: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    fake.script("down", server_error(), server_error(), server_error())
    _, events = await run_to_end(client, "hi", model="openai:down")
    assert events[-1].event == "run.failed"

    circuits = (await client.get("/api/models/circuits")).json()["circuits"]
    down = next(c for c in circuits if c["model"] == "openai:down")
    assert down["state"] == "open" and down["consecutiveFailures"] == 3
    assert down["retryInS"] > 0

    _, events = await run_to_end(client, "hi", model="openai:down")
    data = events[-1].data["data"]
    assert data["errorType"] == "model_call_failed" and data["errorClass"] == "circuit_open"
    assert data["attempts"] == 0
    assert len(fake.served_for("down")) == 3


@pytest.mark.parametrize(
    ("options", "limit"),
    [({"maxModelCalls": 1}, "maxModelCalls"), ({"maxTokens": 100}, "maxTokens")],
)
async def test_budget_ends_the_run_with_a_clear_reason(
    client: httpx.AsyncClient, fake: FakeOpenAI, options: dict[str, Any], limit: str
) -> None:
    fake.script(
        "gpt-4o-mini",
        Reply(
            text="Working.",
            tool_calls=[FakeToolCall("current_time")],
            usage=usage_block(150, 10),
        ),
    )
    accepted, events = await run_to_end(
        client, "what time is it?", model="openai:gpt-4o-mini", options=options
    )
    data = events[-1].data["data"]
    assert events[-1].event == "run.failed"
    assert data["errorType"] == "budget_exceeded" and data["limit"] == limit
    assert "budget" in data["message"]
    assert len(fake.served_for("gpt-4o-mini")) == 1
    usage = (await client.get(f"/api/runs/{accepted['runId']}/usage")).json()
    assert usage["budget"][limit] == next(iter(options.values()))


async def test_unknown_provider_or_model_is_a_400_at_request_time(
    client: httpx.AsyncClient,
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()
    url = f"/api/conversations/{conv['conversationId']}/messages"
    for model in ("nope:thing", "openai:", "litellm:no-provider-prefix", "scripted:none"):
        response = await client.post(url, json={"content": "hi", "model": model})
        assert response.status_code == 400, (model, response.text)
        assert response.json()["error"]["code"] == "unknown_model"
    response = await client.post("/api/conversations", json={"model": "bogus"})
    assert response.status_code == 400


async def test_routing_rules_pick_the_model_when_the_request_names_none(
    client: httpx.AsyncClient,
) -> None:
    picks = []
    for content, body in [
        ("plan this", {"options": {"needs": ["reasoning"]}}),
        ("x" * 250, {}),
        ("short", {}),
        ("short", {"model": "openai:explicit"}),
    ]:
        accepted, events = await run_to_end(client, content, **body)
        assert events[-1].event == "run.completed", events[-1].data
        picks.append((accepted["model"], accepted["modelSource"]))
        created = events[0].data["data"]
        assert created["modelSource"] == accepted["modelSource"]
    assert picks == [
        ("openai:thinker", "rule:0"),
        ("openai:big", "rule:1"),
        ("demo", "default"),
        ("openai:explicit", "request"),
    ]


async def test_daily_aggregates_per_tenant_and_user_match_the_ledger(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    await run_to_end(client, "hi", model="openai:my-llama")
    await run_to_end(client, "hi", model="openai:mystery")
    by_tenant = (await client.get("/api/usage", params={"groupBy": "tenant"})).json()
    by_user = (await client.get("/api/usage", params={"groupBy": "user"})).json()
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS calls, sum(total_tokens) AS tokens, count(DISTINCT run_id) AS runs"
            " FROM model_calls WHERE tenant_id = 'default'"
        )
        expected = await cur.fetchone()
    assert expected is not None
    [day] = by_tenant["days"]
    assert day["tenantId"] == "default"
    assert day["modelCalls"] == expected["calls"] and day["runs"] == expected["runs"]
    assert day["totalTokens"] == expected["tokens"]
    [user_day] = by_user["days"]
    assert user_day["userId"] == "local" and user_day["modelCalls"] == expected["calls"]
    assert day["cost"] is None  # the "mystery" model's call has no price
    bad = await client.get("/api/usage", params={"from": "2025-02-01", "to": "2025-01-01"})
    assert bad.status_code == 422


async def test_models_endpoint_describes_providers_without_keys(
    client: httpx.AsyncClient,
) -> None:
    body = (await client.get("/api/models")).json()
    assert body["providers"]["openai"]["configured"] is True
    assert body["fallbacks"] == {"openai:primary": ["openai:backup"]}
    assert "test-key" not in str(body)
    missing = await client.get("/api/runs/run_missing/usage")
    assert missing.status_code == 404
