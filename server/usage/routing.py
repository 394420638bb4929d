"""Which model a run uses: explicit choice > a routing rule on the request > the default."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from server.settings import RouteRule


@dataclass(frozen=True)
class ModelPick:
    """The model id picked and why: `request`, `conversation`, `rule:<n>` or `default`."""

    model_id: str
    source: str


def rule_matches(rule: RouteRule, text: str, needs: Sequence[str]) -> bool:
    """Say whether every condition the rule sets holds for this request."""
    if rule.min_chars is not None and len(text) < rule.min_chars:
        return False
    if rule.max_chars is not None and len(text) > rule.max_chars:
        return False
    return set(rule.needs) <= set(needs)


def pick_model(
    *,
    requested: str | None,
    conversation_model: str | None,
    text: str,
    needs: Sequence[str],
    rules: Sequence[RouteRule],
    default: str,
) -> ModelPick:
    """Pick the model for a run; the first matching rule wins."""
    if requested:
        return ModelPick(requested, "request")
    if conversation_model:
        return ModelPick(conversation_model, "conversation")
    for index, rule in enumerate(rules):
        if rule_matches(rule, text, needs):
            return ModelPick(rule.model, f"rule:{index}")
    return ModelPick(default, "default")
