"""Which words of a question select full-text candidates, from the planner's word statistics."""

from __future__ import annotations

import pytest

from server.knowledge.terms import PAIRS, WordStats, choose_words, tsquery

pytestmark = pytest.mark.timeout(10)

# 100,000 chunks: "norway" in 4 %, "climat" in 1.6 %, "like" in 0.3 %, "countri" in 30 %.
STATS = WordStats(
    {"norway": 0.04, "climat": 0.016, "like": 0.003, "countri": 0.3}, floor=0.001, chunks=1e5
)


def test_the_rarest_word_selects_and_the_next_only_within_the_budget() -> None:
    text = choose_words(["climat", "like", "norway"], STATS, common=0.1, budget=2_000)
    # like (300 chunks) + climat (1,600) fit in 2,000; norway (4,000) would not.
    assert text.select == ("like", "climat")
    assert not text.all_needed
    assert text.words == ("climat", "like", "norway")


def test_the_rarest_word_selects_even_when_it_alone_passes_the_budget() -> None:
    text = choose_words(["norway", "climat"], STATS, common=0.1, budget=100)
    assert text.select == ("climat",)


def test_a_common_word_never_selects_nor_pairs_but_counts_in_the_rank() -> None:
    text = choose_words(["countri", "norway", "climat"], STATS, common=0.1, budget=10**9)
    assert "countri" not in text.select
    assert "countri" in text.words
    assert all("countri" not in pair for pair in text.pairs)


def test_a_question_of_common_words_only_needs_them_all() -> None:
    text = choose_words(["countri"], STATS, common=0.1, budget=2_000)
    assert text.all_needed and text.select == ("countri",)


def test_pairs_are_the_rarest_first_and_bounded() -> None:
    text = choose_words(["norway", "climat", "like"], STATS, common=0.1, budget=2_000)
    assert text.pairs[0] == ("like", "climat")
    many = choose_words([f"w{i}" for i in range(12)], STATS, common=0.1, budget=2_000)
    assert len(many.pairs) == PAIRS


def test_without_statistics_every_word_selects() -> None:
    text = choose_words(["b", "a"], WordStats(), common=0.1, budget=1)
    assert set(text.select) == {"a", "b"} and not text.all_needed


def test_a_repeated_word_counts_once() -> None:
    assert choose_words(["like", "like"], STATS, common=0.1, budget=9).words == ("like",)


def test_tsquery_quotes_lexemes_so_punctuation_is_no_operator() -> None:
    assert tsquery(["it's", "a|b", "c\\d"], "&") == "'it''s' & 'a|b' & 'c\\\\d'"
