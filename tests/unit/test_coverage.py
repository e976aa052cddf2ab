"""The context read's coverage step (consumers/coverage.py): the head of the ranking re-picked for the
question's aspects and sessions, tiers and the tail kept, off by default."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from epistream.consumers.coverage import aspects, cover, covered, window_size
from epistream.consumers.packing import Candidate, gist_candidate, turn_candidate
from epistream.consumers.ranking import Asked
from epistream.consumers.retrieval import CONTEXT_READ, Coverage, NearGist, RetrievedTurn


def _turn(i: int, text: str, *, day: int = 1, speaker: str = "Ana") -> Candidate:
    turn = RetrievedTurn(conversation_id="c", turn_id=f"t{i}", speaker=speaker, text=text,
                         ts=datetime(2024, 3, day, 20, i, tzinfo=UTC), session_id=None,
                         score=1.0 / (10 + i), dense_rank=i, lexical_rank=None, segment_id=f"c#{day}")
    return turn_candidate(turn)


def _ids(ranked: list[Candidate]) -> list[str]:
    return [str(c.fields.get("turn_id", c.kind)) for c in ranked]


ASKED = Asked.of("Which sports do Ana and Bo play?", "Which sports do and play?", ["Ana", "Bo"])


def test_aspects_are_the_words_the_names_and_the_speakers():
    asked = Asked.of("What did Ana buy in Paris?", "What did buy in Paris?", ["Ana"])
    assert aspects(asked) == {"buy", "paris", "ana"}
    paris = _turn(1, "I bought a hat in Paris", speaker="Bo")
    assert covered(paris, aspects(asked), asked.speakers) == {"paris"}  # "buy" is not in "bought"
    assert covered(_turn(2, "Buy it!"), aspects(asked), asked.speakers) == {"buy", "ana"}  # a short one as a word
    assert covered(_turn(3, "A buyout"), frozenset({"buy"}), frozenset()) == set()


def test_off_by_default_the_ranking_is_kept():
    ranked = [_turn(n, "sports", day=1) for n in range(1, 6)]
    assert CONTEXT_READ.coverage == Coverage() and not Coverage().on
    assert cover(ranked, ASKED, 1000, Coverage()) == ranked


def test_a_day_penalty_spreads_the_head_over_sessions():
    ranked = [_turn(1, "a", day=1), _turn(2, "b", day=1), _turn(3, "c", day=1), _turn(4, "d", day=2)]
    assert _ids(cover(ranked, ASKED, 1000, Coverage(day_penalty=0.05))) == ["t1", "t4", "t2", "t3"]
    # A small penalty moves nothing past a clearly better turn: 1/11 - 0.001 > 1/14.
    assert _ids(cover(ranked, ASKED, 1000, Coverage(day_penalty=0.001))) == ["t1", "t2", "t3", "t4"]


def test_an_aspect_bonus_brings_up_the_first_turn_of_an_aspect_not_yet_covered():
    ranked = [_turn(1, "I play tennis, my favourite sport", speaker="Ana"),
              _turn(2, "Tennis again on Sunday", speaker="Ana"),
              _turn(3, "Football is my sport", speaker="Bo")]
    assert _ids(cover(ranked, ASKED, 1000, Coverage(aspect_bonus=0.05))) == ["t1", "t3", "t2"]


def test_a_length_power_prefers_relevance_per_token():
    ranked = [_turn(1, "word " * 80, day=1), _turn(2, "short", day=2)]
    assert _ids(cover(ranked, ASKED, 1000, Coverage(length_power=1.0))) == ["t2", "t1"]
    assert _ids(cover(ranked, ASKED, 1000, Coverage(length_power=0.01))) == ["t1", "t2"]


def test_tiers_stay_where_the_ranker_put_them():
    period = _turn(5, "x", day=1).plus("period", 1.0)
    gist = gist_candidate(NearGist(conversation_id="c", segment_id="c#1", gist_id="g", text="Ana played tennis.",
                                   turn_ids=["t1"], said_at=datetime(2024, 3, 1, tzinfo=UTC), event_date=date(2024, 3, 1),
                                   date_precision="day", distance=0.1, first_day=date(2024, 3, 1),
                                   last_day=date(2024, 3, 1)), 1, 30)
    ranked = [period, _turn(1, "y", day=1), _turn(2, "z", day=2), gist]
    out = cover(ranked, ASKED, 1000, Coverage(day_penalty=10.0))
    assert out[0] is period and out[-1] is gist  # the day penalty moves neither across its tier
    assert _ids(out[1:3]) == ["t2", "t1"]


def test_only_the_head_that_may_fit_is_re_picked():
    ranked = [_turn(n, "word " * 30, day=n) for n in range(1, 11)]  # about 40 tokens a line
    assert window_size(ranked, 100, 1.0) == 3
    out = cover([*ranked[:3], _turn(20, "tail", day=1), *ranked[3:]], ASKED, 100, Coverage(day_penalty=1.0, window=1.0))
    assert _ids(out)[3] == "t20"  # beyond the window: kept in place


@pytest.mark.parametrize("bad", [{"aspect_bonus": -1.0}, {"day_penalty": -0.1}, {"length_power": -0.5}, {"rank_k": 0.0}, {"window": 0.0}])
def test_weights_are_checked(bad):
    with pytest.raises(ValueError):
        Coverage(**bad)
