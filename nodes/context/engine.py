"""Assemble the model's input once per call: sections, budgets, trimming, summary, manifest."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import attrgetter
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage, ToolMessage

from nodes.context.section_build import SEPARATOR_TOKENS, Report, build_section
from nodes.context.sections import SectionRequest
from nodes.context.setup import ContextSetup
from nodes.context.summary import Summary
from nodes.context.tokens import MESSAGE_OVERHEAD, TokenCounter, message_text, message_tokens
from nodes.context.trim import cut_text, kind_of, with_content
from nodes.errors import ContextOverflowError

TOKENIZER_KEY = "@tokenizer"
_ID = attrgetter("id")
# The summary's heading and separator, kept free on top of its own limit.
SUMMARY_FRAME_TOKENS = 32
_CUT = "#cut"


@dataclass
class Built:
    """The model's input for one call, what it is made of, and the token counts to keep.

    Attributes:
        messages: The request, in order: one system message, the history kept, the turn.
        manifest: What went in and what did not, and why (docs/context.md).
        counts: Token counts of messages counted for the first time (keep them in state).
    """

    messages: list[BaseMessage]
    manifest: dict[str, Any]
    counts: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Counts:
    """Per-message token counts, each message counted once and kept by message id."""

    counter: TokenCounter
    known: Mapping[str, Any]
    new: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.known.get(TOKENIZER_KEY) != self.counter.name:
            self.known = {}
            self.new[TOKENIZER_KEY] = self.counter.name

    def message(self, message: BaseMessage, key_suffix: str = "") -> int:
        key = f"{message.id}{key_suffix}" if message.id else None
        if key is not None:
            found = self.known.get(key)
            if found is None:
                found = self.new.get(key)
            if found is not None:
                return int(found)
        tokens = message_tokens(message, self.counter)
        if key is not None:
            self.new[key] = tokens
        return tokens

    def sizes(self, messages: Sequence[BaseMessage]) -> list[int]:
        """Return each message's tokens: kept counts, else counted now (and kept)."""
        found = list(map(self.known.get, map(_ID, messages)))
        if None not in found:  # the hot path: every message counted before
            return found  # type: ignore[return-value]
        return [
            self.message(m) if t is None else int(t) for m, t in zip(messages, found, strict=True)
        ]


def _fit_items(
    messages: Sequence[BaseMessage],
    sizes: list[int],
    counts: _Counts,
    setup: ContextSetup,
    section: str,
    report: Report,
    offset: int,
) -> tuple[list[BaseMessage], list[int]]:
    """Cut the messages over the item limit (with a note); return them and their sizes."""
    limit = setup.policy.max_item_tokens
    out = list(messages)
    over = [i for i, tokens in enumerate(sizes) if tokens - MESSAGE_OVERHEAD > limit]
    for i in over:
        tokens = sizes[i]
        if not isinstance(out[i].content, str):
            continue
        message = out[i]
        if getattr(message, "tool_calls", None):
            continue  # an assistant's tool call is never rewritten
        cut = cut_text(message_text(message), tokens, limit, setup.counter, kind_of(message))
        out[i] = with_content(message, cut.text)
        sizes[i] = counts.message(out[i], _CUT)
        report.cut.append(
            {
                "section": section,
                "messageId": message.id,
                "index": offset + i,
                "kind": kind_of(message),
                "fromTokens": tokens,
                "toTokens": sizes[i],
                "reason": "over the item limit",
            }
        )
    return out, sizes


def _first_fitting(starts: list[int], prefix: list[int], budget: int) -> int:
    """Return the first turn start from which the rest of the history fits `budget`."""
    total = prefix[-1]
    for start in starts:
        if total - prefix[start] <= budget:
            return start
    return len(prefix) - 1


async def build(
    messages: Sequence[BaseMessage],
    setup: ContextSetup,
    request: SectionRequest,
    *,
    tools_tokens: int,
    counts: Mapping[str, Any],
    emit: Callable[[Any], None],
    step: int,
    attempt: int = 1,
) -> Built:
    """Build the request for one model call and its manifest.

    Raises:
        ContextOverflowError: the instructions and the current turn alone do not fit.
    """
    policy, counter = setup.policy, setup.counter
    tally = _Counts(counter, counts)
    report = Report()
    window = policy.window or setup.window
    available = window - policy.reserve_output_tokens - tools_tokens

    # Sections of the system prompt, in order; dedup across all of them.
    seen: dict[str, str] = {}
    sections: list[dict[str, Any]] = []
    texts: dict[str, list[str]] = {}
    specs = setup.registry.with_budgets(policy.budgets).specs()
    for spec in specs:
        texts[spec.name], entry = await build_section(spec, request, setup, seen, report)
        sections.append(entry)
    by_name = {s.name: s for s in specs}

    all_sizes, humans = setup.memo.index(messages, tally.sizes)
    cur = humans[-1] if humans else len(messages)
    current, current_sizes = _fit_items(
        messages[cur:], all_sizes[cur:], tally, setup, "current", report, cur
    )
    current_tokens = sum(current_sizes)

    def system_tokens() -> int:
        live = [int(s["tokens"]) for s in sections if s["items"]]
        return sum(live) + (MESSAGE_OVERHEAD if live else 0)

    # Drop whole optional sections, lowest priority first, until the pinned parts fit.
    for entry in sorted(sections, key=lambda s: s["priority"]):
        if system_tokens() + current_tokens <= available:
            break
        if by_name[entry["name"]].required or not entry["items"]:
            continue
        report.dropped.append(
            {
                "section": entry["name"],
                "tokens": entry["tokens"],
                "reason": "the window is too small for every section",
            }
        )
        entry.update(items=0, tokens=0, droppedWhole=True)
        entry.pop("itemDetails", None)
        texts[entry["name"]] = []
    if system_tokens() + current_tokens > available:
        raise ContextOverflowError(
            f"the instructions and the current turn need {system_tokens() + current_tokens} "
            f"tokens but {setup.model_id} has {available} for input (window {window} "
            f"minus {policy.reserve_output_tokens} reserved for output and {tools_tokens} for "
            "tools); shorten the message or raise the profile's context window"
        )

    history_room = available - system_tokens() - current_tokens
    history_budget = min(history_room, policy.budgets.get("history", history_room))
    history, sizes = _fit_items(messages[:cur], all_sizes[:cur], tally, setup, "history", report, 0)
    starts = humans[: bisect_left(humans, cur)]
    starts = starts if starts and starts[0] == 0 else [0, *starts]
    summary_info, history, sizes = await _trim_history(
        history, sizes, starts, history_budget, setup, request, report, emit, step
    )
    if summary_info is not None and summary_info.get("text"):
        texts["summary"] = [summary_info.pop("text")]

    system_text = "\n\n".join(t for spec in specs for t in texts[spec.name])
    if texts.get("summary"):
        system_text += "\n\n" + texts["summary"][0]
    built: list[BaseMessage] = [SystemMessage(system_text)] if system_text else []
    built += [*history, *current]
    history_tokens = sum(sizes)
    summary_tokens = int(summary_info["tokens"]) if summary_info else 0
    sections += [
        {
            "name": "summary",
            "kind": "summary",
            "tokens": summary_tokens,
            "budget": policy.summary_max_tokens if policy.summary else 0,
            "items": 1 if summary_tokens else 0,
        },
        {
            "name": "history",
            "kind": "history",
            "budget": history_budget,
            "tokens": history_tokens,
            "items": len(history),
            "toolResults": sum(1 for m in history if isinstance(m, ToolMessage)),
        },
        {
            "name": "current",
            "kind": "current",
            "budget": None,
            "tokens": current_tokens,
            "items": len(current),
        },
    ]
    system_sent = message_tokens(built[0], counter) if system_text else 0
    total = system_sent + history_tokens + current_tokens
    manifest = {
        "step": step,
        "attempt": attempt,
        "model": setup.model_id,
        "tokenizer": counter.name,
        "profile": dict(setup.profile),
        "window": window,
        "reserveOutputTokens": policy.reserve_output_tokens,
        "toolsTokens": tools_tokens,
        "available": available,
        "totalTokens": total,
        "messages": len(built),
        "conversationMessages": len(messages),
        "sections": sections,
        "dropped": report.dropped,
        "cut": report.cut,
        "deduplicated": report.deduplicated,
        "summary": summary_info,
    }
    return Built(built, manifest, tally.new)


async def _trim_history(
    history: list[BaseMessage],
    sizes: list[int],
    starts: list[int],
    budget: int,
    setup: ContextSetup,
    request: SectionRequest,
    report: Report,
    emit: Callable[[Any], None],
    step: int,
) -> tuple[dict[str, Any] | None, list[BaseMessage], list[int]]:
    """Drop whole turns, oldest first, until the history fits; summarise what went if asked."""
    prefix = [0, *accumulate(sizes)]
    if prefix[-1] <= budget or not history:
        return None, history, sizes
    policy = setup.policy
    summarise = policy.summary and setup.summarizer is not None and setup.summaries is not None
    if not summarise:
        drop = _first_fitting(starts, prefix, budget)
        _report_drop(report, history, prefix, starts, drop, summarised=False)
        return None, history[drop:], sizes[drop:]

    assert setup.summarizer is not None and setup.summaries is not None
    target = max(0, budget - policy.summary_max_tokens - SUMMARY_FRAME_TOKENS)
    needed = _first_fitting(starts, prefix, target)
    stored = await setup.summaries.latest(request.conversation_id)
    usable = (
        stored is not None
        and needed <= stored.covers <= len(history)
        and stored.covers in starts
        and history[stored.covers - 1].id == stored.last_message_id
    )
    created = False
    if usable:
        assert stored is not None
        summary, drop = stored, stored.covers
    else:
        # Compact to the low-water mark so the following calls reuse this summary.
        drop = max(needed, _first_fitting(starts, prefix, int(target * policy.summary_low_water)))
        base = (
            stored
            if stored is not None
            and stored.covers <= drop
            and stored.covers
            and (history[stored.covers - 1].id == stored.last_message_id)
            else None
        )
        since = base.covers if base else 0
        text = await setup.summarizer.summarize(
            base.text if base else None, history[since:drop], emit, step=step
        )
        tokens = setup.counter.count(text)
        if tokens > policy.summary_max_tokens:
            cut = cut_text(text, tokens, policy.summary_max_tokens, setup.counter, "summary")
            text, tokens = cut.text, cut.to_tokens
        summary = Summary(
            text,
            drop,
            str(history[0].id),
            str(history[drop - 1].id),
            tokens,
            setup.summarizer.model_id,
        )
        await setup.summaries.save(request.conversation_id, request.run_id, summary)
        created = True
    _report_drop(report, history, prefix, starts, drop, summarised=True)
    heading = f"Summary of the earlier conversation ({summary.covers} messages):\n"
    text = summary.text
    tokens = setup.counter.count(text)
    if tokens > policy.summary_max_tokens:  # stored under another tokenizer or limit
        text = cut_text(text, tokens, policy.summary_max_tokens, setup.counter, "summary").text
    info = {
        "text": heading + text,
        "tokens": setup.counter.count(heading + text) + SEPARATOR_TOKENS,
        "covers": summary.covers,
        "firstMessageId": summary.first_message_id,
        "lastMessageId": summary.last_message_id,
        "model": summary.model,
        "created": created,
        "reused": not created,
    }
    return info, history[drop:], sizes[drop:]


def _report_drop(
    report: Report,
    history: list[BaseMessage],
    prefix: list[int],
    starts: list[int],
    drop: int,
    *,
    summarised: bool,
) -> None:
    if drop == 0:
        return
    turns = bisect_left(starts, drop)
    report.dropped.append(
        {
            "section": "history",
            "turns": turns,
            "messages": drop,
            "tokens": prefix[drop],
            "fromMessageId": history[0].id,
            "toMessageId": history[drop - 1].id,
            "reason": "history over budget; whole turns dropped oldest first",
            "summarised": summarised,
        }
    )
