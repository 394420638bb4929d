"""The context engine: budgets, whole turns, cuts, duplicates, summaries, the registry."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from nodes.context.engine import build
from nodes.context.sections import SectionRequest, SectionSpec, default_registry
from nodes.context.setup import ContextPolicy, ContextSetup
from nodes.context.summary import InMemorySummaryStore
from nodes.context.tokens import EstimateCounter, counter_for, message_tokens, tools_tokens
from nodes.errors import ContextOverflowError

pytestmark = pytest.mark.timeout(30)


def conversation(turns: int, chars: int = 400) -> list[BaseMessage]:
    """Turns of user, tool call, tool result, answer; then a current user message."""
    out: list[BaseMessage] = []
    for t in range(turns):
        out.append(HumanMessage(f"question {t} " + "q" * chars, id=f"u{t}"))
        call = {"name": "lookup", "args": {"n": t}, "id": f"call{t}"}
        out.append(AIMessage("", tool_calls=[call], id=f"a{t}"))
        out.append(ToolMessage(f"result {t} " + "r" * chars, tool_call_id=f"call{t}", id=f"t{t}"))
        out.append(AIMessage(f"answer {t} " + "a" * chars, id=f"b{t}"))
    out.append(HumanMessage("the current question", id="current"))
    return out


def request(messages: Sequence[BaseMessage]) -> SectionRequest:
    return SectionRequest(
        messages=messages,
        run_id="run_1",
        conversation_id="conv_1",
        tenant_id="acme",
        user_id="ada",
        instructions="You are the support agent.",
        now=datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
        display_names={"user": "Ada Lovelace"},
    )


def ignore(_: Any) -> None:
    return None


class ScriptedSummarizer:
    """Summaries without a model, counting its calls (the e2e test uses a real model)."""

    model_id = "scripted:summary"

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, int]] = []

    async def summarize(
        self,
        previous: str | None,
        messages: Sequence[BaseMessage],
        emit: Callable[[Any], None],
        *,
        step: int,
    ) -> str:
        self.calls.append((previous, len(messages)))
        return f"SUMMARY of {len(messages)} messages"


async def test_a_conversation_that_fits_is_sent_whole_with_the_system_prompt() -> None:
    messages = conversation(3)
    built = await build(
        messages,
        ContextSetup(),
        request(messages),
        tools_tokens=0,
        counts={},
        emit=ignore,
        step=1,
    )
    assert built.messages[0].type == "system"
    assert "You are the support agent." in built.messages[0].text
    assert "Ada Lovelace (ada)" in built.messages[0].text
    assert built.messages[1:] == messages
    assert built.manifest["dropped"] == [] and built.manifest["summary"] is None
    assert built.manifest["totalTokens"] <= built.manifest["available"]


async def test_trimming_drops_whole_turns_oldest_first_and_keeps_the_current_message() -> None:
    messages = conversation(200)
    setup = ContextSetup(policy=ContextPolicy(window=8_000, reserve_output_tokens=1_000))
    built = await build(
        messages, setup, request(messages), tools_tokens=500, counts={}, emit=ignore, step=1
    )
    sent = built.messages[1:]
    assert sent[-1].id == "current"
    assert sent[0].type == "human"  # a kept history starts at a turn
    called = {c["id"] for m in sent if isinstance(m, AIMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in sent if isinstance(m, ToolMessage)}
    assert called == answered
    counter = EstimateCounter()
    assert sum(message_tokens(m, counter) for m in built.messages) <= 8_000 - 1_000 - 500
    assert built.manifest["totalTokens"] <= built.manifest["available"] == 6_500
    [dropped] = built.manifest["dropped"]
    assert dropped["section"] == "history" and dropped["summarised"] is False
    assert dropped["messages"] == len(messages) - len(sent)
    assert dropped["fromMessageId"] == "u0"


async def test_an_over_long_tool_result_is_cut_with_a_note() -> None:
    messages = conversation(1, chars=100_000)
    setup = ContextSetup(policy=ContextPolicy(window=200_000, max_item_tokens=1_000))
    built = await build(
        messages, setup, request(messages), tools_tokens=0, counts={}, emit=ignore, step=1
    )
    result = next(m for m in built.messages if isinstance(m, ToolMessage))
    assert "[cut: " in result.text and "tool result" in result.text
    assert EstimateCounter().count(result.text) <= 1_000
    assert {c["messageId"] for c in built.manifest["cut"]} == {"u0", "t0", "b0"}


async def test_exact_duplicates_across_sections_are_removed() -> None:
    async def memory(_: SectionRequest) -> list[str]:
        return ["the user likes tea", "the user likes tea", "the office is in Paris"]

    async def knowledge(_: SectionRequest) -> list[str]:
        return ["the office is in Paris", "opening hours are 9 to 5"]

    registry = default_registry().with_section(SectionSpec("memory", memory, 30, 50))
    registry = registry.with_section(SectionSpec("knowledge", knowledge, 40, 40))
    messages = conversation(1)
    built = await build(
        messages,
        ContextSetup(registry=registry),
        request(messages),
        tools_tokens=0,
        counts={},
        emit=ignore,
        step=1,
    )
    system = built.messages[0].text
    assert system.count("the user likes tea") == 1 and system.count("Paris") == 1
    assert [(d["section"], d["duplicateOf"]) for d in built.manifest["deduplicated"]] == [
        ("memory", "memory[0]"),
        ("knowledge", "memory[2]"),
    ]
    names = [s["name"] for s in built.manifest["sections"]]
    assert names == [
        "instructions",
        "identity",
        "memory",
        "knowledge",
        "summary",
        "history",
        "current",
    ]


async def test_low_priority_sections_go_first_when_the_window_is_small() -> None:
    async def knowledge(_: SectionRequest) -> list[str]:
        return ["k" * 12_000]

    registry = default_registry().with_section(SectionSpec("knowledge", knowledge, 40, 10))
    messages = conversation(1)
    setup = ContextSetup(
        registry=registry,
        policy=ContextPolicy(window=3_000, reserve_output_tokens=500, max_item_tokens=5_000),
    )
    built = await build(
        messages, setup, request(messages), tools_tokens=0, counts={}, emit=ignore, step=1
    )
    assert "kkkk" not in built.messages[0].text
    assert built.manifest["dropped"][0]["section"] == "knowledge"


async def test_a_current_turn_larger_than_the_window_is_refused_clearly() -> None:
    messages = [HumanMessage("x" * 40_000, id="m")]
    setup = ContextSetup(
        policy=ContextPolicy(window=2_000, reserve_output_tokens=500, max_item_tokens=50_000)
    )
    with pytest.raises(ContextOverflowError, match="shorten the message"):
        await build(
            messages, setup, request(messages), tools_tokens=0, counts={}, emit=ignore, step=1
        )


async def test_summaries_replace_the_dropped_prefix_and_are_reused() -> None:
    summarizer, store = ScriptedSummarizer(), InMemorySummaryStore()
    setup = ContextSetup(
        policy=ContextPolicy(window=8_000, reserve_output_tokens=1_000, summary=True),
        summarizer=summarizer,
        summaries=store,
    )
    messages = conversation(100)
    first = await build(
        messages, setup, request(messages), tools_tokens=0, counts={}, emit=ignore, step=1
    )
    assert len(summarizer.calls) == 1
    assert "SUMMARY of" in first.messages[0].text
    assert first.manifest["summary"]["created"] is True
    assert first.manifest["totalTokens"] <= first.manifest["available"]

    # Two more turns later: the stored summary still covers enough, no new call.
    longer = [*messages[:-1], *conversation(102)[-9:]]
    second = await build(
        longer, setup, request(longer), tools_tokens=0, counts=first.counts, emit=ignore, step=1
    )
    assert len(summarizer.calls) == 1
    assert second.manifest["summary"]["reused"] is True
    assert second.manifest["summary"]["covers"] == first.manifest["summary"]["covers"]


async def test_each_message_is_counted_once_and_the_counts_are_kept() -> None:
    class Counting(EstimateCounter):
        calls = 0

        def count(self, text: str) -> int:
            Counting.calls += 1
            return super().count(text)

    messages = conversation(50)
    setup = ContextSetup(counter=Counting(name="counting"))
    first = await build(
        messages, setup, request(messages), tools_tokens=0, counts={}, emit=ignore, step=1
    )
    assert len(first.counts) == len(messages) + 1  # and the tokenizer's name
    before = Counting.calls
    await build(
        messages,
        setup,
        request(messages),
        tools_tokens=0,
        counts=first.counts,
        emit=ignore,
        step=2,
    )
    assert Counting.calls - before == 3  # the system prompt only: two sections, then whole


def test_openai_models_are_counted_with_their_tokenizer_offline() -> None:
    counter = counter_for("gpt-4o-mini")
    assert counter.name == "tiktoken:o200k_base"
    assert counter.count("hello world") == 2
    assert counter_for("llama3.1").name == "estimate:chars/4"


async def test_a_replaced_message_is_counted_again_within_a_run() -> None:
    messages = conversation(3)
    setup = ContextSetup()
    first = await build(
        messages, setup, request(messages), tools_tokens=0, counts={}, emit=ignore, step=1
    )
    longer = [*messages, AIMessage("a new answer", id="new")]
    changed = [HumanMessage("short", id="u0-edited"), *longer[1:]]
    for sent in (longer, changed):
        built = await build(
            sent, setup, request(sent), tools_tokens=0, counts=first.counts, emit=ignore, step=2
        )
        counter = EstimateCounter()
        sections = {s["name"]: s["tokens"] for s in built.manifest["sections"]}
        assert sections["history"] + sections["current"] == sum(
            message_tokens(m, counter) for m in sent
        )


def test_the_tools_schemas_cost_what_the_model_is_shown_and_a_changed_tool_is_counted_anew() -> (
    None
):
    def lookup(city: str, days: int = 1) -> str:
        """Look up the weather of a city for some days."""
        return city

    def shout(text: str) -> str:
        """Say the text louder."""
        return text.upper()

    counter = EstimateCounter()
    tools = [StructuredTool.from_function(lookup), StructuredTool.from_function(shout)]
    shown = json.dumps(
        [convert_to_openai_tool(t) for t in tools], ensure_ascii=False, sort_keys=True
    )
    assert tools_tokens(tools, counter) == counter.count(shown)
    assert tools_tokens(tools, counter) == counter.count(shown)  # counted again, the same
    assert tools_tokens([], counter) == 0

    longer = StructuredTool.from_function(
        shout, description="Say the text louder, so that everyone in the room hears it."
    )
    assert tools_tokens([tools[0], longer], counter) > tools_tokens(tools, counter)
