"""Whole turns, cutting over-long items, and removing exact duplicates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter, is_

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

from nodes.context.tokens import TokenCounter

_TYPE = attrgetter("type")


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


class HistoryMemo:
    """Each message's size and the user messages' places, kept between the calls of a run.

    A turn is a user message with the answers, tool calls and tool results that follow it, so
    dropping whole turns (from one user message to the next) never separates a tool call
    from its result; the last user message starts the current turn.

    A run's messages only grow between its model calls, so each call indexes only the
    messages added since the last one; any other change (a replaced message) re-indexes all.
    Reading an attribute of 10,000 messages costs milliseconds: this keeps calls flat.
    """

    def __init__(self) -> None:
        self._seen: list[BaseMessage] = []
        self._sizes: list[int] = []
        self._humans: list[int] = []

    def index(
        self,
        messages: Sequence[BaseMessage],
        size_of: Callable[[Sequence[BaseMessage]], list[int]],
    ) -> tuple[list[int], list[int]]:
        """Return every message's size (from `size_of`) and the indexes of user messages."""
        known = len(self._seen)
        if known > len(messages) or not all(map(is_, self._seen, messages)):
            known = 0
            self._sizes, self._humans = [], []
        added = messages[known:]
        self._sizes = [*self._sizes, *size_of(added)]
        self._humans = [
            *self._humans,
            *(known + i for i, kind in enumerate(map(_TYPE, added)) if kind == "human"),
        ]
        self._seen = list(messages)
        return self._sizes, self._humans
