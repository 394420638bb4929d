"""Which of a query's words select full-text candidates, from the planner's word statistics.

A full-text list ranks every chunk its query selects, so the cost of a search follows the
number of chunks its words match. The planner's statistics of `kb_chunks.tsv` (the share of
chunks holding each common word, gathered by ANALYZE) tell how many that is before the
search runs: the rarest words select candidates, up to a budget of chunks; the other words
still count in the rank (docs/decisions/1403). The statistics are read once per process and
kept for a few minutes, not joined into every search.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from server.db.pool import Conn

# The pairs of query words that select candidates first, the rarest pairs taken.
PAIRS = 15

_STATS = """
SELECT c.reltuples, s.most_common_elems::text::text[] AS elems,
    s.most_common_elem_freqs AS freqs
FROM pg_class c
LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = 'kb_chunks'
    AND s.attname = 'tsv'
WHERE c.oid = 'kb_chunks'::regclass
"""


@dataclass(frozen=True)
class WordStats:
    """The share of chunks holding each common word, as the planner's statistics say."""

    shares: Mapping[str, float] = field(default_factory=dict)
    # Share of the least common listed word: every unlisted word is at most this common.
    floor: float = 0.0
    chunks: float = 0.0

    def share(self, word: str) -> float:
        """Return the share of chunks holding `word` (0 without statistics)."""
        return self.shares.get(word, self.floor)


@dataclass(frozen=True)
class TextQuery:
    """A question's full-text query: its words, and those that select the candidates.

    `select` are joined by OR; when `all_needed`, the query is made only of common words and
    a candidate must hold them all.
    """

    words: tuple[str, ...]
    select: tuple[str, ...]
    all_needed: bool
    pairs: tuple[tuple[str, str], ...] = ()


def choose_words(
    words: Sequence[str], stats: WordStats, *, common: float, budget: int
) -> TextQuery:
    """Return which of `words` (lexemes) select full-text candidates.

    A word in more than `common` of all chunks never selects on its own. Of the others, the
    rarest always selects, and the next rarest while the chunks they are estimated to match
    stay within `budget`; the `PAIRS` rarest pairs of them select first.
    """
    unique = tuple(dict.fromkeys(words))
    ranked = sorted(unique, key=lambda w: (stats.share(w), w))
    rare = [w for w in ranked if stats.share(w) <= common]
    if not rare:
        return TextQuery(unique, unique, all_needed=True)
    chosen: list[str] = []
    rows = 0.0
    for word in rare:
        estimate = stats.share(word) * stats.chunks
        if chosen and rows + estimate > budget:
            break
        chosen.append(word)
        rows += estimate
    pairs = sorted(
        itertools.combinations(rare, 2), key=lambda p: stats.share(p[0]) * stats.share(p[1])
    )
    return TextQuery(unique, tuple(chosen), all_needed=False, pairs=tuple(pairs[:PAIRS]))


def tsquery(words: Sequence[str], operator: str) -> str:
    """Return `words` (lexemes already normalised) as a `tsquery` joined by `operator`."""
    quoted = ("'" + w.replace("\\", "\\\\").replace("'", "''") + "'" for w in words)
    return f" {operator} ".join(quoted)


@dataclass
class WordStatsCache:
    """The word statistics of `kb_chunks`, read at most once per `ttl_s` seconds."""

    ttl_s: float = 300.0
    _stats: WordStats | None = None
    _read_at: float = 0.0

    async def get(self, conn: Conn) -> WordStats:
        """Return the statistics, reading them on `conn` when they are missing or stale."""
        now = time.monotonic()
        if self._stats is None or now - self._read_at > self.ttl_s:
            self._stats = await read_word_stats(conn)
            self._read_at = now
        return self._stats


async def read_word_stats(conn: Conn) -> WordStats:
    """Read the planner's statistics of `kb_chunks.tsv` (empty before the first ANALYZE)."""
    cur = await conn.execute(_STATS)
    row = await cur.fetchone()
    if row is None or row["elems"] is None:
        return WordStats(chunks=float(row["reltuples"]) if row else 0.0)
    elems, freqs = list(row["elems"]), list(row["freqs"])
    # most_common_elem_freqs ends with the minimum, the maximum and the null share.
    return WordStats(
        dict(zip(elems, freqs, strict=False)),
        floor=float(freqs[len(elems)]) if len(freqs) > len(elems) else 0.0,
        chunks=max(0.0, float(row["reltuples"])),
    )
