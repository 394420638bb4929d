"""Automatic skill selection: load the skill whose description best matches the message.

Similarity is the cosine of offline lexical vectors (nodes/embeddings/lexical.py): word and
character overlap, not meaning, with no model call and no cost. It picks at most one skill,
and only above the profile's floor; the model can still load others with `load_skill`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

from nodes.context.tokens import message_text
from nodes.embeddings.lexical import lexical_vector
from skills.library import SkillSummary

DIMS = 512
DEFAULT_MIN_SIMILARITY = 0.3


def last_user_text(messages: Sequence[BaseMessage]) -> str:
    """Return the text of the latest user message."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message_text(message)
    return ""


def query_vector(text: str) -> list[float]:
    """Return the lexical vector of a message."""
    return lexical_vector(text, DIMS)


@lru_cache(maxsize=4096)
def _about(name: str, description: str) -> tuple[float, ...]:
    # Pure and keyed by the text, so the vectors of a library are computed once per process.
    return tuple(lexical_vector(f"{name.replace('-', ' ')} {description}", DIMS))


def similarity(query: Sequence[float], skill: SkillSummary) -> float:
    """Return the lexical cosine of a message's vector and the skill's name and description."""
    return sum(a * b for a, b in zip(query, _about(skill.name, skill.description), strict=True))


def best_match(
    messages: Sequence[BaseMessage], available: Sequence[SkillSummary], options: Mapping[str, Any]
) -> tuple[SkillSummary, float] | None:
    """Return the skill most similar to the user's message, if it clears the floor."""
    text = last_user_text(messages)
    if not text.strip() or not available:
        return None
    floor = float(options.get("minSimilarity", DEFAULT_MIN_SIMILARITY))
    query = query_vector(text)
    scored = [(entry, similarity(query, entry)) for entry in available]
    entry, score = max(scored, key=lambda pair: pair[1])
    return (entry, score) if score >= floor else None
