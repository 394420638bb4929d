"""What a run's context build is configured with: policy, tokenizer, sections, summaries.

Kept free of graph imports so that `graphs/context.py` can carry it in `RunContext`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodes.context.sections import SectionRegistry, default_registry
from nodes.context.summary import Summarizer, SummaryStore
from nodes.context.tokens import EstimateCounter, TokenCounter

# For models whose window nobody knows (the demo model, a self-hosted one without a profile).
DEFAULT_WINDOW = 32_768
DEFAULT_RESERVE_OUTPUT = 4_096
DEFAULT_MAX_ITEM_TOKENS = 8_000


@dataclass(frozen=True)
class ContextPolicy:
    """A profile's context settings (docs/context.md).

    Attributes:
        window: The model's context window; None takes it from litellm's model map.
        reserve_output_tokens: Kept free for the answer.
        budgets: Token budgets by section name (`history`, `identity`, `memory`...).
        max_item_tokens: A single item (tool result, pasted document) over this is cut.
        summary: Replace dropped history with a running summary.
        summary_max_tokens: Room kept for the summary in the history's budget.
        summary_low_water: After summarising, the kept history fills at most this share of
            its budget, so that the following calls reuse the summary.
        summary_input_tokens: The most transcript a summarising call reads.
    """

    window: int | None = None
    reserve_output_tokens: int = DEFAULT_RESERVE_OUTPUT
    budgets: Mapping[str, int] = field(default_factory=dict)
    max_item_tokens: int = DEFAULT_MAX_ITEM_TOKENS
    summary: bool = False
    summary_max_tokens: int = 1_000
    summary_low_water: float = 0.5
    summary_input_tokens: int = 16_000


@dataclass(frozen=True)
class ContextSetup:
    """Everything `build_context` needs besides the state, built by the server per attempt.

    Attributes:
        policy: Windows, budgets, cutting and summaries.
        window: The model's window as resolved (profile, then litellm's map, then default).
        counter: The model's tokenizer.
        registry: The sections to build, in order.
        summarizer: Makes summaries (None: summaries off whatever the policy says).
        summaries: Where summaries are stored and found again.
        profile: The agent profile's name and version, for the manifest.
        model_id: The model the call goes to.
        display_names: Known display names (`tenant`, `user`).
        section_options: Per-section settings from the profile (memory, retrieval...).
    """

    policy: ContextPolicy = field(default_factory=ContextPolicy)
    window: int = DEFAULT_WINDOW
    counter: TokenCounter = field(default_factory=EstimateCounter)
    registry: SectionRegistry = field(default_factory=default_registry)
    summarizer: Summarizer | None = None
    summaries: SummaryStore | None = None
    profile: Mapping[str, Any] = field(default_factory=lambda: {"name": "default", "version": 0})
    model_id: str = "demo"
    display_names: Mapping[str, str] = field(default_factory=dict)
    section_options: Mapping[str, object] = field(default_factory=dict)
