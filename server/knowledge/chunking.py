"""Blocks to chunks: a target size in tokens, an overlap, and the document's structure kept.

A heading closes the chunk under way and becomes part of the path of those that follow; a
code block is never cut unless it alone is over twice the target (then by lines); a long
paragraph is cut between sentences. Consecutive chunks of one section share `overlap`
tokens of text, so that a fact on a boundary is whole in at least one of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nodes.context.tokens import EstimateCounter, TokenCounter
from server.knowledge.parsing import Block

DEFAULT_TARGET_TOKENS = 300
DEFAULT_OVERLAP_TOKENS = 40
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Chunk:
    """One searchable piece of a document.

    Attributes:
        position: Its place in the document (0-based).
        text: What is embedded and searched.
        heading_path: The headings it sits under, outermost first.
        page: The PDF page it starts on.
        tokens: Its size.
    """

    position: int
    text: str
    heading_path: tuple[str, ...]
    page: int | None
    tokens: int


@dataclass
class _Builder:
    target: int
    overlap: int
    counter: TokenCounter
    chunks: list[Chunk] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    tokens: int = 0
    path: tuple[str, ...] = ()
    page: int | None = None
    fresh: bool = True  # nothing but the carried overlap in `parts`

    def close(self, *, carry: bool) -> None:
        if self.parts and not self.fresh:
            text = "\n\n".join(self.parts)
            self.chunks.append(
                Chunk(len(self.chunks), text, self.path, self.page, self.counter.count(text))
            )
            tail = _tail(text, self.overlap, self.counter) if carry else ""
        else:
            tail = ""
        self.parts = [tail] if tail else []
        self.tokens = self.counter.count(tail) if tail else 0
        self.fresh = True

    def add(self, text: str, page: int | None) -> None:
        size = self.counter.count(text)
        if not self.fresh and self.tokens + size > self.target:
            self.close(carry=True)
        if self.fresh:
            self.page = page
        self.parts.append(text)
        self.tokens += size
        self.fresh = False


def _tail(text: str, tokens: int, counter: TokenCounter) -> str:
    """The last whole words of `text` that fit in `tokens`."""
    if tokens <= 0:
        return ""
    words = text.split()
    kept: list[str] = []
    for word in reversed(words):
        if counter.count(" ".join([word, *kept])) > tokens:
            break
        kept.insert(0, word)
    return " ".join(kept) if len(kept) < len(words) else ""


def _pieces(block: Block, target: int, counter: TokenCounter) -> Iterable[str]:
    """Cut a block that is over its limit: code by lines, prose between sentences."""
    limit = target * 2 if block.kind == "code" else target
    if counter.count(block.text) <= limit:
        yield block.text
        return
    units = block.text.split("\n") if block.kind == "code" else _SENTENCE.split(block.text)
    joiner = "\n" if block.kind == "code" else " "
    current: list[str] = []
    for unit in units:
        while counter.count(unit) > target:  # one sentence or line longer than a chunk
            cut = len(unit) * target // max(1, counter.count(unit))
            if current:
                yield joiner.join(current)
                current = []
            yield unit[:cut]
            unit = unit[cut:]
        if current and counter.count(joiner.join([*current, unit])) > target:
            yield joiner.join(current)
            current = []
        current.append(unit)
    if current:
        yield joiner.join(current)


def chunk_blocks(
    blocks: Sequence[Block],
    *,
    target_tokens: int = DEFAULT_TARGET_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    counter: TokenCounter | None = None,
) -> list[Chunk]:
    """Group a document's blocks into chunks of about `target_tokens`."""
    counter = counter or EstimateCounter()
    overlap = min(overlap_tokens, target_tokens // 2)
    builder = _Builder(target_tokens, overlap, counter)
    headings: list[tuple[int, str]] = []
    for block in blocks:
        if block.kind == "heading":
            builder.close(carry=False)
            headings = [(lvl, text) for lvl, text in headings if lvl < block.level]
            headings.append((block.level, block.text))
            builder.path = tuple(text for _, text in headings)
            continue
        for piece in _pieces(block, target_tokens, counter):
            builder.add(piece, block.page)
    builder.close(carry=False)
    return builder.chunks
