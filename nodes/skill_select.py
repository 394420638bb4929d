"""Automatic skill selection: load the skill whose description best matches the message.

Similarity is the cosine of offline lexical vectors (nodes/embeddings/lexical.py): word and
character overlap, not meaning, with no model call and no cost. It picks at most one skill,
and only above the profile's floor; the model can still load others with `load_skill`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

from nodes.context.tokens import message_text
from nodes.embeddings.lexical import lexical_vector
from skills.library import LibrarySkill

DIMS = 512
DEFAULT_MIN_SIMILARITY = 0.3


def _last_user_text(messages: Sequence[BaseMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message_text(message)
    return ""


def similarity(text: str, skill: LibrarySkill) -> float:
    """Return the lexical cosine of `text` and the skill's name and description."""
    about = f"{skill.skill.name.replace('-', ' ')} {skill.skill.description}"
    return sum(
        a * b for a, b in zip(lexical_vector(text, DIMS), lexical_vector(about, DIMS), strict=True)
    )


def best_match(
    messages: Sequence[BaseMessage], available: Sequence[LibrarySkill], options: Mapping[str, Any]
) -> tuple[LibrarySkill, float] | None:
    """Return the skill most similar to the user's message, if it clears the floor."""
    text = _last_user_text(messages)
    if not text.strip() or not available:
        return None
    floor = float(options.get("minSimilarity", DEFAULT_MIN_SIMILARITY))
    scored = [(entry, similarity(text, entry)) for entry in available]
    entry, score = max(scored, key=lambda pair: pair[1])
    return (entry, score) if score >= floor else None
