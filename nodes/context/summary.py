"""Running summaries of the history that no longer fits.

A summary covers the conversation's first `covers` messages (a prefix that ends at a turn
boundary) and is stored by that range, so later calls and runs reuse it while it still fits
and extend it (previous summary + the newly dropped messages) when more must go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from graphs.context import ModelCaller
from nodes.context.tokens import TokenCounter, message_text

SUMMARY_PROMPT = (
    "You maintain the running summary of a conversation between a user and an assistant "
    "that uses tools. Write a concise summary of the transcript below (and of the previous "
    "summary, if given) that keeps what later turns need: the user's goals and preferences, "
    "facts and numbers established, decisions, tool results that matter, and open questions. "
    "Write plain prose, no preamble."
)
# Each message of the transcript is cut to this many characters before it is summarised.
TRANSCRIPT_ITEM_CHARS = 4_000


@dataclass(frozen=True)
class Summary:
    """A summary of the conversation's first `covers` messages.

    Attributes:
        text: The summary.
        covers: How many messages, from the start, it covers.
        first_message_id, last_message_id: The ids of the first and last messages covered.
        tokens: Its size with the tokenizer it was counted with.
        model: The model that wrote it.
    """

    text: str
    covers: int
    first_message_id: str
    last_message_id: str
    tokens: int
    model: str


class SummaryStore(Protocol):
    """Where a conversation's summaries are kept."""

    async def latest(self, conversation_id: str) -> Summary | None:
        """Return the summary covering the most messages, if any."""
        ...

    async def save(self, conversation_id: str, run_id: str, summary: Summary) -> None:
        """Store a summary (idempotent for the same range)."""
        ...


@dataclass
class InMemorySummaryStore:
    """Summaries kept in memory (`langgraph dev`, unit tests)."""

    saved: dict[str, list[Summary]] = field(default_factory=dict)

    async def latest(self, conversation_id: str) -> Summary | None:
        """Return the summary covering the most messages, if any."""
        found = self.saved.get(conversation_id) or []
        return max(found, key=lambda s: s.covers) if found else None

    async def save(self, conversation_id: str, run_id: str, summary: Summary) -> None:
        """Keep `summary`."""
        self.saved.setdefault(conversation_id, []).append(summary)


class Summarizer(Protocol):
    """Write a summary of `messages`, extending `previous`."""

    @property
    def model_id(self) -> str:
        """The model that writes the summaries."""
        ...

    async def summarize(
        self,
        previous: str | None,
        messages: Sequence[BaseMessage],
        emit: Callable[[Any], None],
        *,
        step: int,
    ) -> str:
        """Return a summary of `messages` that extends `previous`."""
        ...


def transcript(messages: Sequence[BaseMessage]) -> str:
    """Render messages as a plain transcript, each cut to `TRANSCRIPT_ITEM_CHARS`."""
    lines = []
    for m in messages:
        role = {HumanMessage: "User", AIMessage: "Assistant", ToolMessage: "Tool result"}.get(
            type(m), m.type
        )
        text = message_text(m)
        if len(text) > TRANSCRIPT_ITEM_CHARS:
            text = (
                text[:TRANSCRIPT_ITEM_CHARS]
                + f" [... {len(text) - TRANSCRIPT_ITEM_CHARS} characters cut]"
            )
        lines.append(f"{role}: {text}")
    return "\n".join(lines)


def fit_transcript(
    messages: Sequence[BaseMessage], counter: TokenCounter, limit: int
) -> tuple[str, int]:
    """Return the transcript of the latest messages that fit `limit` tokens.

    Also return how many earlier messages were left out.
    """
    kept: list[BaseMessage] = []
    used = 0
    for m in reversed(messages):
        cost = counter.count(message_text(m)[:TRANSCRIPT_ITEM_CHARS]) + 4
        if kept and used + cost > limit:
            break
        kept.append(m)
        used += cost
    kept.reverse()
    return transcript(kept), len(messages) - len(kept)


@dataclass
class ModelSummarizer:
    """Summarise with a model call through the run's caller.

    The call is retried, metered in the usage ledger and traced like any other call.

    Attributes:
        caller: A caller for the summary model, sharing the run's usage meter.
        model_id: The summary model's id.
        counter: The summary model's tokenizer (to fit its input).
        input_tokens: The most transcript one call reads.
    """

    caller: ModelCaller
    model_id: str
    counter: TokenCounter
    input_tokens: int = 16_000

    async def summarize(
        self,
        previous: str | None,
        messages: Sequence[BaseMessage],
        emit: Callable[[Any], None],
        *,
        step: int,
    ) -> str:
        """Return a summary of `previous` plus `messages`."""
        text, left_out = fit_transcript(messages, self.counter, self.input_tokens)
        parts = []
        if previous:
            parts.append(f"Previous summary:\n{previous}")
        if left_out:
            parts.append(f"({left_out} earlier messages were too long to include.)")
        parts.append(f"Transcript:\n{text}")
        answer = await self.caller.call(
            [SystemMessage(SUMMARY_PROMPT), HumanMessage("\n\n".join(parts))],
            [],
            emit,
            step=step,
        )
        return answer.text.strip()
