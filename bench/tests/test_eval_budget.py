"""The equal-budget recall eval: cutting a ranking at a budget, scoring it, the offline rankings, the split."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import numpy as np
import pytest

from bench.budget_recall import SPLITS, missed_evidence, missed_table, score, split_samples, summarise, table
from bench.budget_systems import (
    BM25,
    Piece,
    Query,
    bare_text,
    cut,
    dated_text,
    order_by,
    recall_with_sources,
    rrf,
    turn_piece,
    turn_tokens,
    verbatim_recall,
    where_missed,
    words,
)
from epistream.client.sources import LocomoSample
from epistream.contracts.turns import Turn


def piece(turn_id: str, tokens: int, verbatim: bool = True) -> Piece:
    return Piece((turn_id,), f"text of {turn_id}", tokens, verbatim)


def test_token_cost_is_a_quarter_of_the_characters_of_speaker_and_text_rounded_up() -> None:
    assert turn_tokens("Al", "hi") == 2  # "Al: hi" is 6 characters
    assert turn_tokens("Caroline", "x" * 30) == 10  # 40 characters
    assert turn_piece("D1:1", "Al", "hi") == Piece(("D1:1",), "Al: hi", 2)


def test_the_dated_text_carries_the_session_time_as_locomo_writes_it_and_the_speaker() -> None:
    turn = Turn(tenant="t", conversation_id="c", turn_id="D1:1", speaker="Caroline", text="Hey Mel!",
                ts=datetime(2023, 5, 8, 13, 56, tzinfo=UTC))
    assert dated_text(turn) == "[1:56 pm on 8 May, 2023] Caroline: Hey Mel!"
    assert bare_text(turn) == "Hey Mel!"


def test_cut_keeps_the_longest_prefix_that_fits_and_stops_at_the_first_piece_that_does_not() -> None:
    ranked = [piece("a", 100), piece("b", 100), piece("c", 100), piece("d", 10)]
    assert [p.turn_ids[0] for p in cut(ranked, 250)] == ["a", "b"]  # "d" would fit but ranks below "c"
    assert [p.turn_ids[0] for p in cut(ranked, 300)] == ["a", "b", "c"]
    assert cut(ranked, 50) == []


def test_cut_charges_a_turn_already_in_the_context_nothing_again() -> None:
    ranked = [piece("a", 100), piece("a", 100), piece("b", 100)]
    assert [p.turn_ids[0] for p in cut(ranked, 200)] == ["a", "b"]


def test_recall_counts_verbatim_turns_and_the_second_figure_also_credits_gist_sources() -> None:
    context = [piece("D1:1", 5), Piece(("D1:2", "D1:3"), "gist: they met", 4, verbatim=False)]
    assert verbatim_recall(["D1:1", "D1:2"], context) == 0.5
    assert recall_with_sources(["D1:1", "D1:2"], context) == 1.0
    assert verbatim_recall([], context) is None


def test_bm25_ranks_the_turn_sharing_the_rare_word_first_and_ignores_stop_words() -> None:
    scores = BM25(["we went to the lake", "the the the the", "I adopted a puppy named Max"]).scores(
        "What is the name of the puppy?")
    assert order_by(scores)[0] == 2
    assert scores[1] == 0.0
    assert words("What is the puppy's name") == ["puppy's", "name"]


def test_rrf_fuses_ranks_and_a_double_second_beats_a_single_first() -> None:
    assert rrf([0, 1, 2], [1, 2, 0])[0] == 1


def _sample(sample_id: str) -> LocomoSample:
    return LocomoSample(sample_id, sample_id, [], [])


def test_split_holds_the_issue_conversations_and_a_missing_one_is_an_error() -> None:
    samples = [_sample(c) for c in ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43")]
    assert [s.sample_id for s in split_samples(samples, "report")] == list(SPLITS["report"])
    assert len(split_samples(samples, "all")) == 5
    with pytest.raises(SystemExit, match="conv-43"):
        split_samples(samples[:4], "report")


class BudgetAwareContext:
    """How a context builder plugs in: it fits its own budget, so it is asked once per budget."""

    name = "context"
    budget_aware = True

    def __init__(self) -> None:
        self.budgets: list[int] = []

    async def pieces(self, query: Query, budget: int) -> list[Piece]:
        self.budgets.append(budget)
        # Reaches the evidence only with 1,000 tokens or more.
        return [piece("D1:1", 10)] if budget >= 1000 else [piece("D9:9", 10)]


class Ranking:
    name = "ranking"
    budget_aware = False

    def __init__(self) -> None:
        self.calls = 0

    async def pieces(self, query: Query, budget: int) -> list[Piece]:
        self.calls += 1
        return [piece(f"D2:{n}", 100) for n in range(50)] + [piece("D1:1", 100)]


def test_score_asks_a_budget_aware_system_per_budget_and_a_ranking_once_and_summarises_by_budget() -> None:
    query = Query("conv-26#0", "conv-26", "conv-26", "q", 1, ("D1:1",), datetime(2023, 5, 8, tzinfo=UTC),
                  np.zeros(384, dtype=np.float32))
    context, ranking = BudgetAwareContext(), Ranking()
    records = asyncio.run(score([context, ranking], [query], (500, 1000)))
    assert context.budgets == [500, 1000] and ranking.calls == 1
    assert records[0]["recall"] == {"context": {"500": 0.0, "1000": 1.0}, "ranking": {"500": 0.0, "1000": 0.0}}
    assert records[0]["tokens"]["ranking"] == {"500": 500, "1000": 1000}
    summary = summarise(records, ["context", "ranking"], (500, 1000))
    assert summary["recall_at_budget"]["context"]["1000"] == 1.0
    assert summary["recall_at_budget_by_category"]["context"]["1"]["500"] == 0.0
    assert "| context | 0.000 | 1.000 |" in table(summary)


def test_where_missed_places_each_missing_evidence_turn_among_the_gathered_or_says_it_was_not_gathered() -> None:
    context = [piece("D1:1", 10), piece("D1:9", 10, verbatim=False)]  # D1:9 only as a gist's source
    found = where_missed(["D1:1", "D1:9", "D2:4", "D3:3"], context, ["D1:1", "D5:5", "D1:9", "D2:4"])
    assert found == {"turns_in_context": 1, "missed": {"D1:9": 3, "D2:4": 4, "D3:3": None}}
    assert where_missed(["D1:1"], context, [])["missed"] == {}


def test_missed_evidence_counts_evidence_turns_per_category_held_ranked_below_or_not_gathered() -> None:
    unscored: dict = {"recall": {}, "recall_with_sources": {}, "tokens": {}}

    def record(category: int, evidence: list[str], missed: dict[str, int | None], held: int) -> dict:
        return {"category": category, "evidence": evidence, **unscored,
                "where_missed": {"context": {"1000": {"turns_in_context": held, "missed": missed}}}}

    records = [record(1, ["a", "b", "c"], {"b": 30, "c": None}, 18), record(1, ["d"], {}, 20),
               record(3, ["e", "f"], {"e": 50, "f": 70}, 22), {"category": 3, "evidence": ["g"], **unscored}]  # not explained
    summary = missed_evidence(records, "context", "1000")
    assert summary["1"] == {"evidence_turns": 4, "in_context": 2, "gathered_ranked_below": 1, "not_gathered": 1,
                            "place_of_ranked_below_p50": 30, "turns_in_context_p50": 20}
    assert summary["3"]["gathered_ranked_below"] == 2 and summary["3"]["evidence_turns"] == 2
    assert summary["all"]["evidence_turns"] == 6 and summary["all"]["not_gathered"] == 1
    table = missed_table(summary, "where it was")
    assert "| multi-hop | 4 | 2 | 1 (30) | 1 | 20 |" in table
    assert summarise(records, ["context"], (1000,))["missed_evidence"]["context"]["1000"] == summary
