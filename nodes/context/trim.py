"""Whole turns, cutting over-long items, and removing exact duplicates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

from nodes.context.tokens import TokenCounter


def current_turn_start(messages: Sequence[BaseMessage]) -> int:
    """Return the index of the last user message (the current turn starts there), or len."""
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], HumanMessage):
            return index
    return len(messages)


def turn_starts(messages: Sequence[BaseMessage]) -> list[int]:
    """Return the indexes where turns start: 0 and every user message.

    A turn is a user message with the answers, tool calls and tool results that follow it,
    so dropping whole turns never separates a tool call from its result.
    """
    starts = [0]
    starts += [i for i, m in enumerate(messages) if i and isinstance(m, HumanMessage)]
    return starts


@dataclass(frozen=True)
class Cut:
    """A text cut to fit the item limit."""

    text: str
    from_tokens: int
    to_tokens: int
    from_chars: int


def cut_text(text: str, tokens: int, limit: int, counter: TokenCounter, what: str) -> Cut:
    """Keep the head of `text` within `limit` tokens and say, at the end, what was cut."""
    keep = max(0, int(len(text) * (limit / max(tokens, 1)) * 0.95) - 120)
    for _ in range(4):
        omitted = len(text) - keep
        note = (
            f"\n[cut: {omitted:,} of {len(text):,} characters of this {what} were omitted "
            f"to fit the {limit:,}-token item limit]"
        )
        cut = text[:keep] + note
        size = counter.count(cut)
        if size <= limit:
            return Cut(cut, tokens, size, len(text))
        keep = int(keep * limit / size * 0.9)
    return Cut(note.lstrip("\n"), tokens, counter.count(note), len(text))


def kind_of(message: BaseMessage) -> str:
    """Name a message's kind for cut notes and the manifest."""
    if isinstance(message, ToolMessage):
        return "tool result"
    if isinstance(message, HumanMessage):
        return "user message"
    return f"{message.type} message"


def with_content(message: BaseMessage, content: str) -> BaseMessage:
    """Return a copy of `message` with new text content (same id, tool call id...)."""
    return message.model_copy(update={"content": content})
