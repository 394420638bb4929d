"""Build the system prompt's sections, and report every decision for the manifest.

Each item is deduplicated, cut to the item limit and fitted to its section's budget.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from nodes.context.sections import SectionItems, SectionRequest, SectionSpec
from nodes.context.setup import ContextSetup
from nodes.context.trim import cut_text

# The blank line between two items of the system prompt, counted with each item.
SEPARATOR_TOKENS = 2


@dataclass
class Report:
    """What a build dropped, cut and deduplicated, and why: the manifest's lists."""

    dropped: list[dict[str, Any]] = field(default_factory=list)
    cut: list[dict[str, Any]] = field(default_factory=list)
    deduplicated: list[dict[str, Any]] = field(default_factory=list)


def _section_items(
    name: str,
    items: list[str],
    budget: int | None,
    setup: ContextSetup,
    seen: dict[str, str],
    report: Report,
) -> tuple[list[str], int, list[int]]:
    counter, limit = setup.counter, setup.policy.max_item_tokens
    kept: list[str] = []
    positions: list[int] = []
    used = 0
    for position, text in enumerate(items):
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen:
            report.deduplicated.append(
                {
                    "section": name,
                    "item": position,
                    "duplicateOf": seen[digest],
                    "reason": "exact duplicate",
                }
            )
            continue
        seen[digest] = f"{name}[{position}]"
        tokens = counter.count(text) + SEPARATOR_TOKENS
        if tokens > limit:
            cut = cut_text(text, tokens, limit, counter, f"{name} item")
            report.cut.append(
                {
                    "section": name,
                    "item": position,
                    "fromTokens": tokens,
                    "toTokens": cut.to_tokens,
                    "reason": "over the item limit",
                }
            )
            text, tokens = cut.text, cut.to_tokens
        if budget is not None and used + tokens > budget:
            report.dropped.append(
                {
                    "section": name,
                    "item": position,
                    "tokens": tokens,
                    "reason": f"over the section's budget ({budget} tokens)",
                }
            )
            continue
        kept.append(text)
        positions.append(position)
        used += tokens
    return kept, used, positions


async def build_section(
    spec: SectionSpec,
    request: SectionRequest,
    setup: ContextSetup,
    seen: dict[str, str],
    report: Report,
) -> tuple[list[str], dict[str, Any]]:
    """Build one section: its kept texts (framed if the spec says so) and its manifest entry."""
    items = await spec.provider(request)
    head, tail = spec.frame or ("", "")
    frame_tokens = setup.counter.count(f"{head}\n{tail}") if spec.frame and items else 0
    budget = None if spec.budget is None else spec.budget - frame_tokens
    kept, used, positions = _section_items(spec.name, items, budget, setup, seen, report)
    if kept and spec.frame:
        kept = ["\n".join([head, *kept, tail])]
        used += frame_tokens
    entry: dict[str, Any] = {
        "name": spec.name,
        "kind": "system",
        "order": spec.order,
        "priority": spec.priority,
        "budget": spec.budget,
        "tokens": used,
        "items": len(positions),
    }
    if isinstance(items, SectionItems) and items.details:
        entry["itemDetails"] = [items.details[i] for i in positions if i < len(items.details)]
    return kept, entry
