"""The offline embedder: hashed word and character n-grams, no network and no download.

It is lexical, not semantic: texts that share words (and word pieces) come out close, texts
that say the same thing in other words do not. It exists so that memory works anywhere
(`make run`, tests, air-gapped machines); use `openai:` or `litellm:` for meaning.
"""

from __future__ import annotations

import hashlib
import math
import re
from itertools import pairwise

LEXICAL_MODEL = "lexical:v1"
_WORD = re.compile(r"[\w']+", re.UNICODE)
# Words so common that matching them says nothing about two texts being related.
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "with",
        "by",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "this",
        "that",
        "i",
        "me",
        "my",
        "we",
        "our",
        "you",
        "your",
        "he",
        "she",
        "they",
        "them",
        "their",
        "his",
        "her",
        "its",
        "as",
        "so",
        "do",
        "does",
        "did",
        "not",
        "no",
        "have",
        "has",
        "had",
        "will",
        "would",
        "can",
        "could",
        "should",
        "from",
        "about",
        "into",
        "than",
        "then",
        "there",
        "here",
        "what",
        "which",
        "who",
        "whom",
        "when",
        "where",
        "why",
        "how",
    ]
)


def words(text: str) -> list[str]:
    """Return the text's lower-case words without the most common ones."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def _bucket(feature: str, dims: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    # One bit of the hash picks the sign, so that collisions cancel out on average.
    return value % dims, 1.0 if (value >> 63) & 1 else -1.0


def lexical_vector(text: str, dims: int) -> list[float]:
    """Embed `text` as an L2-normalised vector of `dims` hashed n-gram weights.

    Features: every word (weight 1), every pair of neighbouring words (0.5), and the
    character trigrams of each word (0.3, so that `prefer` and `preferences` meet).
    """
    found = words(text)
    features: dict[str, float] = {}
    for word in found:
        features[f"w:{word}"] = features.get(f"w:{word}", 0.0) + 1.0
        padded = f"<{word}>"
        for i in range(len(padded) - 2):
            gram = f"c:{padded[i : i + 3]}"
            features[gram] = features.get(gram, 0.0) + 0.3
    for left, right in pairwise(found):
        features[f"b:{left} {right}"] = features.get(f"b:{left} {right}", 0.0) + 0.5
    vector = [0.0] * dims
    for feature, weight in features.items():
        index, sign = _bucket(feature, dims)
        vector[index] += sign * (1.0 + math.log(weight)) if weight >= 1 else sign * weight
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        # pgvector's cosine distance of a zero vector is undefined; a fixed unit vector keeps
        # an empty text searchable (and far from everything).
        vector[0] = 1.0
        return vector
    return [v / norm for v in vector]


def lexical_tokens(text: str) -> int:
    """Count what the lexical embedder read, for the usage ledger: its words."""
    return len(_WORD.findall(text))
