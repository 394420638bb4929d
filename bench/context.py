"""Context building: time per model call at 10, 1,000 and 10,000 messages, and tokens sent.

The engine runs as `build_context` runs it: tiktoken (o200k, gpt-4o-mini's) counting, a
128k window, whole-turn trimming, token counts kept between calls. "Cold" is the first call
of a conversation loaded without counts (every message counted); "warm" is every later
call (counts kept in the state, only new messages counted). The naive baseline sends the
system prompt and every message.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from bench.common import Figures, stat_line
from nodes.context.engine import Built, build
from nodes.context.sections import SectionRequest
from nodes.context.setup import ContextPolicy, ContextSetup
from nodes.context.summary import InMemorySummaryStore
from nodes.context.tokens import counter_for, message_tokens
from nodes.context.trim import HistoryMemo

SIZES = (10, 1_000, 10_000)
WINDOW = 128_000
VOCABULARY = [
    *[
        "order",
        "parcel",
        "refund",
        "invoice",
        "account",
        "delivery",
        "address",
        "payment",
        "customer",
        "support",
    ],
    *[
        "ticket",
        "status",
        "update",
        "please",
        "thanks",
        "tracking",
        "number",
        "warehouse",
        "carrier",
        "weekend",
    ],
    *[
        "monday",
        "return",
        "label",
        "price",
        "discount",
        "subscription",
        "plan",
        "upgrade",
        "error",
        "message",
    ],
]


def conversation(size: int, seed: int = 7) -> list[BaseMessage]:
    """`size` messages in turns of user, tool call, tool result, answer; a user message last."""
    rng = random.Random(seed)

    def words(low: int, high: int) -> str:
        return " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(low, high)))

    out: list[BaseMessage] = []
    turn = 0
    while len(out) < size - 1:
        out.append(HumanMessage(words(10, 80), id=f"u{turn}"))
        call = {"name": "lookup_order", "args": {"order": f"A{turn:05d}"}, "id": f"c{turn}"}
        out.append(AIMessage("", tool_calls=[call], id=f"a{turn}"))
        out.append(ToolMessage(words(20, 200), tool_call_id=f"c{turn}", id=f"t{turn}"))
        out.append(AIMessage(words(20, 120), id=f"b{turn}"))
        turn += 1
    out = out[: size - 1]
    while out and (isinstance(out[-1], ToolMessage) or getattr(out[-1], "tool_calls", None)):
        out.pop()  # never end on an unanswered tool call
    out.append(HumanMessage("where is my parcel now?", id="current"))
    return out


def request(messages: Sequence[BaseMessage]) -> SectionRequest:
    """Return the section request of one model call over `messages`."""
    return SectionRequest(
        messages=messages,
        run_id="run_bench",
        conversation_id="conv_bench",
        tenant_id="acme",
        user_id="ada",
        instructions="You are Acme's support agent. Answer briefly and use the tools.",
        now=datetime.now(UTC),
    )


def ignore(_: Any) -> None:
    """Drop an emitted event: the benchmark stores none."""
    return None


class FixedSummarizer:
    """A summary without a model: the benchmark times the engine, not a provider."""

    model_id = "bench:fixed"

    async def summarize(
        self,
        previous: str | None,
        messages: Sequence[BaseMessage],
        emit: Callable[[Any], None],
        *,
        step: int,
    ) -> str:
        """Return a fixed summary of `messages`."""
        return f"The user asked about {len(messages)} messages' worth of orders."


async def timed_build(
    messages: list[BaseMessage], setup: ContextSetup, counts: dict[str, Any]
) -> tuple[float, Built]:
    """Build the context once; return the milliseconds it took and what was built."""
    began = time.perf_counter()
    built = await build(
        messages, setup, request(messages), tools_tokens=150, counts=counts, emit=ignore, step=1
    )
    return time.perf_counter() - began, built


async def measure(quick: bool, figures: Figures) -> None:
    """Time context builds at each conversation size and record the tokens sent."""
    counter = counter_for("gpt-4o-mini")
    plain = ContextSetup(policy=ContextPolicy(window=WINDOW), counter=counter, model_id="bench")
    summarised = ContextSetup(
        policy=ContextPolicy(window=WINDOW, summary=True),
        counter=counter,
        summarizer=FixedSummarizer(),
        summaries=InMemorySummaryStore(),
        model_id="bench",
    )
    repeats = 5 if quick else 30
    per_message: dict[int, float] = {}
    for size in SIZES:
        messages = conversation(size)
        cold, built = await timed_build(messages, replace(plain, memo=HistoryMemo()), {})
        counts = {**built.counts}
        first, warm = [], []
        for _ in range(repeats):
            # A run's first call: counts come from the state, sizes are indexed afresh.
            elapsed, built = await timed_build(messages, replace(plain, memo=HistoryMemo()), counts)
            first.append(elapsed)
        for _ in range(repeats):
            # A later call of the run: two messages were added since its previous call.
            run = replace(plain, memo=HistoryMemo())
            await timed_build(messages[:-2], run, counts)
            elapsed, built = await timed_build(messages, run, counts)
            warm.append(elapsed)
        per_message[size] = min(first) / size  # the repeat least disturbed by other load
        naive = counter.count(request(messages).instructions) + sum(
            message_tokens(m, counter) for m in messages
        )
        sent = built.manifest["totalTokens"]
        figures.add(
            f"- {size:,} messages: later call of a run {stat_line(warm)}; first call of a "
            f"run {stat_line(first)}; cold (every message counted) {cold * 1000:.1f} ms; "
            f"tokens sent {sent:,} vs naive {naive:,} ({sent / naive:.0%}), "
            f"{built.manifest['messages']:,} messages sent"
        )
    growth = per_message[10_000] / per_message[1_000]
    figures.add(
        f"- growth: a run's first call (fastest repeat) takes {growth:.2f}x as long per message "
        "at 10,000 messages as at 1,000 (1.0 = linear)"
    )
    messages = conversation(10_000)
    _, made = await timed_build(messages, summarised, {})
    reused = []
    for _ in range(repeats):
        run = replace(summarised, memo=HistoryMemo())
        await timed_build(messages[:-2], run, made.counts)
        elapsed, built = await timed_build(messages, run, made.counts)
        reused.append(elapsed)
    summary = built.manifest["summary"]
    figures.add(
        f"- 10,000 messages with summaries on (summary of {summary['covers']:,} messages "
        f"reused, no model call): later call of a run {stat_line(reused)}; tokens sent "
        f"{built.manifest['totalTokens']:,}"
    )
    target = sorted(warm)[len(warm) // 2] * 1000
    figures.add(
        f"- target: under 20 ms at 10,000 messages (later calls, p50), linear: "
        f"**{'met' if target < 20 and growth < 1.5 else 'missed'}**"
    )


def main(database_url: str, quick: bool) -> Figures:
    """Run the context benchmark (no database needed)."""
    figures = Figures("Context building", "python -m bench.run --only context")
    figures.add(f"- load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    figures.add(
        f"- window {WINDOW:,} tokens (gpt-4o-mini), tiktoken o200k_base, 4,096 reserved for "
        "output; turns of user message, tool call, tool result (20-200 words), answer"
    )
    asyncio.run(measure(quick, figures))
    return figures
