"""The model caller with the real `openai` and `litellm` adapters against a fake HTTP server.

Every fault the fake can produce must end in the right retry, fallback or failure, and every
attempt must be reported as a `usage` event whose tokens are exactly what the server sent.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from nodes.errors import BudgetExceededError, ModelCallFailedError
from nodes.models.breaker import CircuitBreakers
from nodes.models.caller import ModelChoice, ModelPolicy, ResilientModelCaller
from nodes.models.litellm_chat import LiteLLMChatModel
from nodes.models.usage import Budget, UsageMeter
from server.settings import Settings
from server.usage.pricing import load_litellm
from tests.support.fake_openai import (
    FakeOpenAI,
    FakeToolCall,
    Reply,
    context_length_error,
    rate_limited,
    server_error,
    usage_block,
)

# Quick backoff, and timeouts far above a loaded machine's slowest call (litellm's first
# request builds its client): a test that is not about timeouts must never meet one, or it
# sees an extra attempt. Under load, 0.5 s to the first token was not always enough.
FAST = ModelPolicy(
    max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.02, ttft_timeout_s=20, timeout_s=30
)
# For the test of the time-to-first-token timeout itself.
TIGHT = ModelPolicy(
    max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.02, ttft_timeout_s=0.5, timeout_s=1.5
)
Adapter = Callable[[FakeOpenAI, str], ModelChoice]


@tool
def lookup(term: str) -> str:
    """Look a term up."""
    return term


def openai_choice(fake: FakeOpenAI, model: str) -> ModelChoice:
    chat = ChatOpenAI(model=model, api_key="k", base_url=fake.url, max_retries=0, stream_usage=True)
    return ModelChoice(f"openai:{model}", "openai", model, chat)


def litellm_choice(fake: FakeOpenAI, model: str) -> ModelChoice:
    chat = LiteLLMChatModel(model=f"openai/{model}", api_base=fake.url, api_key="k")
    return ModelChoice(f"litellm:openai/{model}", "litellm", f"openai/{model}", chat)


@pytest.fixture(scope="module")
async def fake(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FakeOpenAI]:
    # litellm's first import takes seconds; do it before anything is timed.
    load_litellm(Settings(_env_file=None, data_dir=Path(tmp_path_factory.mktemp("d"))))  # type: ignore[call-arg]
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture(params=[openai_choice, litellm_choice], ids=["openai", "litellm"])
def adapter(request: pytest.FixtureRequest, fake: FakeOpenAI) -> Adapter:
    fake.reset()
    return request.param  # type: ignore[no-any-return]


async def call(
    caller: ResilientModelCaller, tools: list[Any] | None = None
) -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    message = await caller.call([HumanMessage("hi")], tools or [], events.append, step=1)
    return message, events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["event"] + (f":{e['call']['status']}" if e["event"] == "usage" else "") for e in events
    ]


async def test_answer_is_normalised_with_text_tool_calls_usage_and_reasoning(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script(
        "m",
        Reply(
            text="Let me look.",
            tool_calls=[FakeToolCall("lookup", {"term": "agentrt"}, id="call_a")],
            reasoning="The user wants a lookup.",
            usage=usage_block(prompt=120, completion=30, cached=100, reasoning=12),
        ),
    )
    message, events = await call(ResilientModelCaller([adapter(fake, "m")], FAST), [lookup])

    assert message.text == "Let me look."
    assert message.tool_calls == [
        {"name": "lookup", "args": {"term": "agentrt"}, "id": "call_a", "type": "tool_call"}
    ]
    served = fake.served_for("m")
    assert len(served) == 1
    assert served[0].body["tools"][0]["function"]["name"] == "lookup"
    meta = message.response_metadata["agentrt"]
    assert meta["finishReason"] == "tool_calls"
    if adapter is litellm_choice:  # ChatOpenAI drops `reasoning_content`; litellm keeps it
        assert meta["reasoning"] == "The user wants a lookup."
    [usage] = events
    assert usage["event"] == "usage"
    call_row = usage["call"]
    assert (call_row["inputTokens"], call_row["outputTokens"]) == (120, 30)
    assert (call_row["cachedInputTokens"], call_row["reasoningTokens"]) == (100, 12)
    assert call_row["status"] == "ok" and call_row["attempt"] == 1
    assert call_row["ttftMs"] is not None and call_row["ttftMs"] <= call_row["latencyMs"]
    assert usage["totals"]["toolCalls"] == 1 and usage["totals"]["modelCalls"] == 1


async def test_429_waits_for_retry_after_then_succeeds(fake: FakeOpenAI, adapter: Adapter) -> None:
    fake.script("m", rate_limited(ms="400"), Reply(text="ok"))
    started = time.monotonic()
    message, events = await call(ResilientModelCaller([adapter(fake, "m")], FAST))
    elapsed = time.monotonic() - started

    assert message.text == "ok"
    assert elapsed >= 0.4
    assert kinds(events) == ["usage:failed", "model.retry", "usage:ok"]
    assert events[0]["call"]["statusCode"] == 429
    assert events[0]["call"]["errorClass"] == "rate_limited"
    assert events[1]["delayS"] == 0.4
    assert len(fake.served_for("m")) == 2


async def test_retry_after_beyond_the_limit_is_not_waited_for(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script("m", rate_limited("3600"))
    fake.script("fb", Reply(text="from the fallback"))
    caller = ResilientModelCaller([adapter(fake, "m"), adapter(fake, "fb")], FAST)
    message, events = await call(caller)

    assert message.text == "from the fallback"
    assert kinds(events) == ["usage:failed", "model.fallback", "usage:ok"]
    assert events[2]["call"]["fallbackIndex"] == 1


async def test_server_errors_are_retried_with_backoff(fake: FakeOpenAI, adapter: Adapter) -> None:
    fake.script("m", server_error(500), server_error(503), Reply(text="third time"))
    message, events = await call(ResilientModelCaller([adapter(fake, "m")], FAST))

    assert message.text == "third time"
    assert kinds(events) == [
        "usage:failed",
        "model.retry",
        "usage:failed",
        "model.retry",
        "usage:ok",
    ]
    assert [e["call"]["attempt"] for e in events if e["event"] == "usage"] == [1, 2, 3]
    assert [e["call"]["statusCode"] for e in events if e["event"] == "usage"] == [500, 503, None]


async def test_context_length_error_fails_at_once_without_fallback(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script("m", context_length_error())
    caller = ResilientModelCaller([adapter(fake, "m"), adapter(fake, "fb")], FAST)
    with pytest.raises(ModelCallFailedError) as info:
        await call(caller)

    details = info.value.details
    assert details["errorClass"] == "context_length_exceeded"
    assert details["statusCode"] == 400 and details["attempts"] == 1
    assert fake.served_for("fb") == []


async def test_hang_hits_the_time_to_first_token_timeout_then_retries(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script("m", Reply(hang=True), Reply(text="awake"))
    message, events = await call(ResilientModelCaller([adapter(fake, "m")], TIGHT))

    assert message.text == "awake"
    assert events[0]["call"]["errorClass"] == "ttft_timeout"
    assert 500 <= events[0]["call"]["latencyMs"] < 1500


async def test_a_stall_after_the_first_token_hits_the_call_timeout(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script("m", Reply(text="slow answer", stall_after_chunks=1))
    policy = ModelPolicy(max_attempts=1, ttft_timeout_s=0.5, timeout_s=1.0)
    with pytest.raises(ModelCallFailedError) as info:
        await call(ResilientModelCaller([adapter(fake, "m")], policy))
    assert info.value.details["errorClass"] == "timeout"


async def test_dropped_stream_supersedes_the_partial_item_and_retries(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script(
        "m", Reply(text="This answer breaks off", drop_after_chunks=2), Reply(text="Whole answer")
    )
    message, events = await call(ResilientModelCaller([adapter(fake, "m")], FAST))

    assert message.text == "Whole answer"
    assert kinds(events) == ["usage:failed", "model.retry", "usage:ok"]
    assert events[0]["call"]["errorClass"] == "connection"
    superseded = events[1]["supersedes"]
    assert len(superseded) == 1 and superseded[0] != message.id


async def test_malformed_json_in_the_stream_is_retried(fake: FakeOpenAI, adapter: Adapter) -> None:
    fake.script("m", Reply(text="garbled", malformed_after_chunks=1), Reply(text="clean"))
    message, events = await call(ResilientModelCaller([adapter(fake, "m")], FAST))

    assert message.text == "clean"
    assert events[0]["call"]["errorClass"] == "bad_response"


async def test_no_retry_after_streamed_output_when_superseding_is_off(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script("m", Reply(text="This answer breaks off", drop_after_chunks=2), Reply())
    policy = ModelPolicy(max_attempts=3, backoff_base_s=0.01, retry_after_partial=False)
    with pytest.raises(ModelCallFailedError) as info:
        await call(ResilientModelCaller([adapter(fake, "m")], policy))
    assert "already streamed" in str(info.value)
    assert len(fake.served_for("m")) == 1


async def test_exhausted_retries_fall_back_and_record_which_model_served(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script("m", server_error(), server_error(), server_error())
    fake.script("fb", Reply(text="fallback answer", usage=usage_block(9, 4)))
    caller = ResilientModelCaller([adapter(fake, "m"), adapter(fake, "fb")], FAST)
    message, events = await call(caller)

    assert message.text == "fallback answer"
    fallback = next(e for e in events if e["event"] == "model.fallback")
    assert fallback["fromModel"].endswith("/m") or fallback["fromModel"].endswith(":m")
    assert fallback["errorClass"] == "server_error"
    served = events[-1]["call"]
    assert served["modelId"] == caller.choices[1].model_id
    assert served["requestedModel"] == caller.choices[0].model_id
    assert (served["inputTokens"], served["outputTokens"]) == (9, 4)
    assert message.response_metadata["agentrt"]["modelId"] == caller.choices[1].model_id
    totals = events[-1]["totals"]
    assert totals["modelCalls"] == 4 and totals["failedModelCalls"] == 3


async def test_every_model_failing_reports_attempts_and_the_last_status(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    fake.script("m", *[server_error(502)] * 3)
    fake.script("fb", *[rate_limited("0")] * 3)
    caller = ResilientModelCaller([adapter(fake, "m"), adapter(fake, "fb")], FAST)
    with pytest.raises(ModelCallFailedError) as info:
        await call(caller)
    details = info.value.details
    assert details["attempts"] == 6
    assert details["errorClass"] == "rate_limited" and details["statusCode"] == 429
    assert details["provider"] == caller.choices[1].provider
    assert [t["attempts"] for t in details["tried"]] == [3, 3]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_circuit_opens_sends_calls_to_the_fallback_and_a_probe_closes_it(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    clock = Clock()
    breakers = CircuitBreakers(threshold=2, cooldown_s=30, clock=clock)
    one_try = ModelPolicy(max_attempts=1)
    primary, fallback = adapter(fake, "m"), adapter(fake, "fb")
    fake.script("m", server_error(), server_error())
    for _ in range(2):
        with pytest.raises(ModelCallFailedError):
            await call(ResilientModelCaller([primary], one_try, breakers))
    assert breakers.state(primary.model_id) == "open"

    # Open: no request reaches the primary; the fallback answers.
    message, events = await call(ResilientModelCaller([primary, fallback], one_try, breakers))
    assert len(fake.served_for("m")) == 2
    assert kinds(events) == ["model.fallback", "usage:ok"]
    assert events[0]["errorClass"] == "circuit_open"
    # Open without a fallback: fail fast, with a clear error.
    with pytest.raises(ModelCallFailedError) as info:
        await call(ResilientModelCaller([primary], one_try, breakers))
    assert info.value.details["errorClass"] == "circuit_open"
    assert info.value.details["attempts"] == 0

    clock.now += 30  # cool-down over: one probe goes out and closes the circuit
    fake.script("m", Reply(text="healthy again"))
    message, _ = await call(ResilientModelCaller([primary], one_try, breakers))
    assert message.text == "healthy again"
    assert breakers.state(primary.model_id) == "closed"


async def test_budget_refuses_the_call_before_any_request(
    fake: FakeOpenAI, adapter: Adapter
) -> None:
    meter = UsageMeter(budget=Budget(max_model_calls=1))
    caller = ResilientModelCaller([adapter(fake, "m")], FAST, meter=meter)
    await call(caller)
    with pytest.raises(BudgetExceededError) as info:
        await call(caller)
    assert info.value.details == {"limit": "maxModelCalls", "allowed": "1", "used": "1"}
    assert len(fake.served_for("m")) == 1


def test_both_adapters_are_chat_models() -> None:
    assert issubclass(LiteLLMChatModel, BaseChatModel)
