from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from epistream.consumers.answer import choose_mode
from epistream.consumers.assistants import SegmentText, SegmentTurnText, pick_endpoint, verify
from epistream.consumers.prompts import AssistantReply
from epistream.consumers.retrieval import SegmentRecipe, fuse
from epistream.consumers.router import select
from epistream.contracts.questions import Mode, Question

SCORES = {
    "summary": {"a": 0.9, "b": 0.5, "c": 0.1},
    "dense": {"a": 0.2, "b": 0.8, "d": 0.6},
    "lexical": {"c": 3.0, "d": 1.0},
}


def test_minmax_fusion_weights_each_normalised_pathway():
    fused = fuse(SCORES, SegmentRecipe())
    # a: 0.3*1 + 0.4*0; b: 0.3*0.5 + 0.4*1; c: 0 + 0 + 0.3*1; d: 0.4*(0.4/0.6) + 0
    assert fused["a"] == pytest.approx(0.3)
    assert fused["b"] == pytest.approx(0.3 * 0.5 + 0.4)
    assert fused["c"] == pytest.approx(0.3)
    assert fused["d"] == pytest.approx(0.4 * (0.4 / 0.6))


def test_rrf_fusion_sums_reciprocal_ranks():
    fused = fuse(SCORES, SegmentRecipe(fusion="rrf", rrf_k=60))
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 63)
    assert max(fused, key=fused.get) in {"b", "d"}


def test_a_switched_off_pathway_does_not_count():
    only_dense = SegmentRecipe().only("dense")
    fused = fuse(SCORES, only_dense)
    assert set(fused) == {"a", "b", "d"} and fused["b"] == pytest.approx(0.4)
    assert not only_dense.force_include and SegmentRecipe().only("lexical").force_include


def test_force_include_adds_strong_keyword_hits_beyond_top_k():
    fused = {"a": 0.9, "b": 0.8, "c": 0.1, "d": 0.05}
    assert select(fused, set(), 2) == ["a", "b"]
    assert select(fused, {"d"}, 2) == ["a", "b", "d"]
    assert select(fused, {"a"}, 2) == ["a", "b"], "already in: not added twice"


def test_segments_stick_to_one_endpoint_and_spread_over_the_pool():
    endpoints = ["http://a/v1", "http://b/v1", "http://c/v1"]
    picks = [pick_endpoint(f"conv#{i:04d}", endpoints) for i in range(600)]
    assert picks == [pick_endpoint(f"conv#{i:04d}", endpoints) for i in range(600)]
    assert all(150 < n < 250 for n in Counter(picks).values())
    # A fourth replica moves only the segments it wins (about a quarter), nothing else.
    grown = [pick_endpoint(f"conv#{i:04d}", [*endpoints, "http://d/v1"]) for i in range(600)]
    moved = [i for i, (x, y) in enumerate(zip(picks, grown, strict=True)) if x != y]
    assert all(grown[i] == 3 for i in moved) and 100 < len(moved) < 200


SEGMENT = SegmentText("c#0001", "c", [
    SegmentTurnText("t1", "Ana", "I moved to Lisbon in March, the flat is tiny.", datetime(2024, 3, 20, tzinfo=UTC)),
    SegmentTurnText("t2", "Ben", "Congratulations on the move!", datetime(2024, 3, 20, 1, tzinfo=UTC)),
])


def test_only_quotes_really_in_the_segment_survive_and_are_attributed_to_their_turn():
    reply = AssistantReply.model_validate({"relevant": True, "evidence": [
        {"turn_id": "t2", "quote": "I moved to  LISBON in March"},  # wrong id, right text
        {"turn_id": "t1", "quote": "I moved to Madrid"},           # invented
        {"turn_id": "t1", "quote": "the flat is tiny."},
    ]})
    quotes = verify(reply, SEGMENT)
    assert [(q.turn_id, q.quote) for q in quotes] == [("t1", "I moved to  LISBON in March"),
                                                       ("t1", "the flat is tiny.")]
    assert quotes[0].time == SEGMENT.turns[0].ts and quotes[0].segment_id == "c#0001"


def test_an_irrelevant_reply_yields_no_quotes():
    reply = AssistantReply.model_validate({"relevant": False, "evidence": [{"turn_id": "t1", "quote": "I moved"}]})
    assert verify(reply, SEGMENT) == []


@pytest.mark.parametrize("text, mode", [
    ("When did Ana move to Lisbon?", Mode.AGENTIC),
    ("How many races did she run in 2024?", Mode.AGENTIC),
    ("What does Ana think about her new flat?", Mode.DEEP),
])
def test_auto_picks_structured_tools_for_temporal_and_counting_questions(text, mode):
    assert choose_mode(Question(question_id="q", tenant="t", question=text)) is mode
    assert choose_mode(Question(question_id="q", tenant="t", question=text, mode=Mode.FAST)) is Mode.FAST
