"""The context read's pure logic: contracts, ranking across kinds, deduplication, packing into the
budget, the time window and the question's resolved dates."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from epistream.consumers.outcome import fit_reply
from epistream.consumers.packing import (
    SEPARATOR_TOKENS,
    fact_candidate,
    gist_candidate,
    item_day,
    pack,
    rank,
    render,
    source_candidate,
    turn_candidate,
    used_tokens,
    with_dates,
)
from epistream.consumers.retrieval import CONTEXT_READ, FUSED_TURNS, NamedFact, NearGist, RetrievedTurn
from epistream.consumers.timefilter import asks_about_past, find_period, question_periods, understand
from epistream.contracts.decoding import decode
from epistream.contracts.questions import Mode, Question, TimeRange
from epistream.contracts.replies import Answer, MemoryContext
from epistream.errors import ContractError
from epistream.models.prompts import estimate_tokens

ASKED = datetime(2024, 3, 20, 12, 0, tzinfo=UTC)  # a Wednesday


def _turn(i: int, text: str, *, score: float, conversation: str = "c", offset_h: int = 0) -> RetrievedTurn:
    return RetrievedTurn(conversation_id=conversation, turn_id=f"t{i}", speaker="Ana", text=text,
                         ts=datetime(2024, 3, 18, 20, i, tzinfo=UTC), session_id=None, score=score,
                         dense_rank=i, lexical_rank=None, tz_offset_s=offset_h * 3600)


def _gist(i: int, text: str, *, conversation: str = "c") -> NearGist:
    return NearGist(gist_id=f"g{i}", conversation_id=conversation, segment_id=f"{conversation}#0", text=text,
                    event_date=date(2024, 3, 13), date_precision="day", turn_ids=["t1"],
                    said_at=datetime(2024, 3, 18, 20, 1, tzinfo=UTC), first_day=date(2024, 3, 13),
                    last_day=date(2024, 3, 13), distance=0.2)


def _fact(i: int, obj: str, *, current: bool) -> NamedFact:
    end = None if current else date(2024, 3, 1)
    return NamedFact(fact_id=f"f{i}", conversation_id="c", segment_id="c#0", subject="Alice",
                     predicate="lives_in", object=obj, point_in_time=None, start_time=date(2019, 1, 1),
                     end_time=end, turn_ids=["t3"], said_at=datetime(2024, 3, 18, 20, 3, tzinfo=UTC),
                     first_day=date(2019, 1, 1), last_day=end, current=current)


# --- contracts -------------------------------------------------------------------------------

def test_a_context_question_takes_a_budget_and_an_open_time_range():
    q = decode(b'{"question_id": "q", "tenant": "t", "question": "Where?", "mode": "context", '
               b'"budget_tokens": 250, "time_range": {"start": "2024-03-01T00:00:00Z"}}', Question, what="q")
    assert q.mode is Mode.CONTEXT and q.budget_tokens == 250 and q.time_range.end is None


@pytest.mark.parametrize("budget", [0, 49, 32_001, -5])
def test_a_budget_outside_the_range_is_refused_with_the_range(budget):
    with pytest.raises(ContractError, match="50 to 32000 tokens"):
        decode(f'{{"question_id": "q", "tenant": "t", "question": "x", "mode": "context", "budget_tokens": {budget}}}'
               .encode(), Question, what="q")


def test_a_time_range_must_end_after_it_starts():
    with pytest.raises(ValueError, match="at or after it ends"):
        TimeRange(start=ASKED, end=ASKED)


def test_a_budget_on_a_mode_that_would_ignore_it_is_refused():
    with pytest.raises(ValueError, match="context and fast modes only"):
        Question(question_id="q", tenant="t", question="x", mode=Mode.DEEP, budget_tokens=500)


def test_readers_of_the_reply_topic_tell_a_context_from_an_answer():
    context = MemoryContext(question_id="q", tenant="t", asked_at=ASKED, items=[], text="", budget_tokens=1000,
                            used_tokens=0, latency_ms=1.0)
    answer = Answer(question_id="q", tenant="t", answer="a", abstained=False, evidence=[], mode=Mode.FAST,
                    latency_ms=1.0, tokens={})
    assert isinstance(decode(context.to_bytes(), [Answer, MemoryContext], what="reply"), MemoryContext)
    assert isinstance(decode(answer.to_bytes(), [Answer, MemoryContext], what="reply"), Answer)


# --- ranking and packing -----------------------------------------------------------------

def test_items_fit_the_budget_counted_on_their_own_lines():
    turns = [turn_candidate(_turn(i, "word " * (5 + i), score=1 / (60 + i))) for i in range(1, 40)]
    for budget in (50, 120, 333, 1000):
        packed = pack(rank(turns), budget)
        assert packed.items and packed.used_tokens <= budget
        assert all(item.tokens == estimate_tokens(item.line) for item in packed.items)
        lines = packed.text.splitlines()
        headers = [line for line in lines if line.startswith("# ")]
        assert packed.used_tokens == (sum(i.tokens for i in packed.items) + sum(map(estimate_tokens, headers))
                                      + SEPARATOR_TOKENS * (len(lines) - 1)) == used_tokens(packed.items)
        assert estimate_tokens(packed.text) <= budget
        assert [line for line in lines if line not in headers] == [i.line for i in sorted(packed.items, key=lambda i: i.time)]


def test_the_block_is_in_time_order_under_day_headers_naming_conversations_only_when_several():
    one = [turn_candidate(_turn(i, f"turn {i}", score=1 / i)) for i in (3, 1, 2)]  # said at 20:0i, best first 1, 2, 3
    packed = pack(rank(one), 1000)
    assert packed.text.splitlines() == ["# 2024-03-18 Monday", "[1] 20:01 Ana: turn 1", "[2] 20:02 Ana: turn 2",
                                        "[3] 20:03 Ana: turn 3"]
    assert packed.text.count("# ") == 1 and "conv" not in packed.text
    other = turn_candidate(_turn(9, "elsewhere", score=0.5, conversation="conv-b"))
    both = pack(rank([*one, other]), 1000)
    assert both.text.startswith("# 2024-03-18 Monday, c\n") and "# 2024-03-18 Monday, conv-b\n" in both.text
    assert both.used_tokens == used_tokens(both.items) and estimate_tokens(both.text) <= both.used_tokens


def test_a_line_too_long_for_what_is_left_is_skipped_and_smaller_ones_still_fit():
    long = turn_candidate(_turn(1, "x" * 400, score=0.03))
    short = turn_candidate(_turn(2, "I adopted a cat.", score=0.02))
    packed = pack(rank([long, short]), 60)
    assert [i.turn_id for i in packed.items] == ["t2"] and packed.items[0].line.startswith("[1] ")


def test_the_same_turn_never_twice_and_a_gist_beside_its_source_turn():
    turn = turn_candidate(_turn(1, "I moved to Lisbon last Wednesday.", score=0.03))
    again = turn_candidate(_turn(1, "I moved to Lisbon last Wednesday.", score=0.01))
    gist = gist_candidate(_gist(1, "2024-03-13: Alice moved to Lisbon."), 1, 60)
    overlap = gist_candidate(_gist(2, "2024-03-13:  alice moved to Lisbon."), 2, 60)  # an overlapping segment's
    items = pack(rank([turn, again, gist, overlap]), 1000).items
    assert [(i.kind, i.turn_id or i.gist_id) for i in items] == [("turn", "t1"), ("gist", "g1")]


def test_one_ranking_across_kinds_by_reciprocal_rank():
    both_pathways = turn_candidate(_turn(1, "a", score=1 / 61 + 1 / 61))
    one_pathway = turn_candidate(_turn(2, "b", score=1 / 62))
    gist = gist_candidate(_gist(1, "2024-03-13: c."), 1, 60)  # 1/61
    fact = fact_candidate(_fact(1, "Lisbon", current=True), 1, 60)  # 1/61: a turn wins a tie, then a gist
    assert [c.kind for c in rank([fact, one_pathway, gist, both_pathways])] == ["turn", "gist", "fact", "turn"]


def test_a_turn_carries_its_local_time_ids_scores_and_resolved_dates():
    item = pack([turn_candidate(_turn(1, "I moved to Lisbon last Wednesday.", score=0.03, offset_h=1))], 500).items[0]
    assert item.time.utcoffset() == timedelta(hours=1) and item.time.hour == 21
    assert item.line.startswith("[1] 21:01 Ana: I moved to Lisbon last Wednesday.")
    assert item_day(item) == date(2024, 3, 18)
    assert [(d.expression, d.start) for d in item.dates] == [("last Wednesday", date(2024, 3, 13))]
    assert "[last Wednesday = 2024-03-13]" in item.line
    assert item.scores == {"rrf": 0.03, "dense_rank": 1.0} and item.turn_ids == ["t1"]


def test_a_superseded_fact_says_so_and_a_current_one_does_not():
    old = pack([fact_candidate(_fact(1, "Porto", current=False), 1, 60)], 500).items[0]
    new = pack([fact_candidate(_fact(2, "Lisbon", current=True), 1, 60)], 500).items[0]
    assert old.current is False and "superseded" in old.line and old.end_time == date(2024, 3, 1)
    assert new.current is True and "superseded" not in new.line and new.text == "Alice lives in Lisbon"


def test_a_reply_over_the_message_limit_drops_its_lowest_ranked_items():
    turns = [turn_candidate(_turn(i, "y" * 300, score=1 / (60 + i))) for i in range(1, 60)]
    packed = pack(rank(turns), 32_000)
    context = MemoryContext(question_id="q", tenant="t", asked_at=ASKED, items=packed.items, text=packed.text,
                            budget_tokens=32_000, used_tokens=packed.used_tokens, latency_ms=1.0)
    fitted = fit_reply(context, b"q", limit=8_000)
    assert 0 < len(fitted.items) < len(context.items) and fitted.items == context.items[: len(fitted.items)]
    assert fitted.text == render(fitted.items) and fitted.used_tokens == used_tokens(fitted.items)
    assert len(fitted.to_bytes()) <= 8_000


# --- time --------------------------------------------------------------------------------

def test_last_week_resolves_against_when_it_was_asked_and_is_the_period_the_read_ranks_by():
    period = find_period("What did Alice do last week?", ASKED)
    assert (period.range.start, period.range.end) == (datetime(2024, 3, 11, tzinfo=UTC), datetime(2024, 3, 18, tzinfo=UTC))
    (resolved,) = question_periods("What did Alice do last week?", ASKED, period)
    assert (resolved.expression, resolved.start, resolved.end, resolved.filters) == (
        "last week", date(2024, 3, 11), date(2024, 3, 17), True)


def test_the_asked_range_is_the_only_hard_filter_and_the_questions_period_is_kept_apart():
    when = understand("What happened in March 2024?", ASKED, TimeRange(start=datetime(2024, 3, 10, tzinfo=UTC)))
    assert (when.asked.start, when.asked.end) == (datetime(2024, 3, 10, tzinfo=UTC), None)
    assert when.period is not None and when.period.range.days == (date(2024, 3, 1), date(2024, 3, 31))
    met = when.asked.meet(when.period.range)
    assert (met.start, met.end) == (datetime(2024, 3, 10, tzinfo=UTC), datetime(2024, 4, 1, tzinfo=UTC))
    assert met.days == (date(2024, 3, 10), date(2024, 3, 31))
    assert understand("What happened?", ASKED, TimeRange(end=datetime(2024, 1, 1, tzinfo=UTC))).asked.meet(
        when.period.range).empty
    assert understand("What happened?", ASKED).asked.days == (None, None)


def test_only_questions_about_the_past_read_superseded_facts():
    assert asks_about_past("Where did Alice live before Lisbon?", None, ASKED)
    assert asks_about_past("Where does Alice live?", datetime(2024, 3, 18, tzinfo=UTC), ASKED)  # a past period
    assert not asks_about_past("Where does Alice live?", None, ASKED)


def test_a_larger_budget_reads_deeper():
    small, gists_small, _ = CONTEXT_READ.candidate_counts(250, FUSED_TURNS)
    large, gists_large, facts_large = CONTEXT_READ.candidate_counts(4000, FUSED_TURNS)
    assert small.top_k < large.top_k and large.pool >= large.top_k and gists_small <= gists_large
    assert CONTEXT_READ.candidate_counts(32_000, FUSED_TURNS)[0].top_k == 1_000 and facts_large == 40


def test_beyond_a_thousand_tokens_the_turns_asked_for_grow_less_than_the_budget():
    depth = [CONTEXT_READ.candidate_counts(budget, FUSED_TURNS)[0].top_k for budget in (500, 1000, 2000, 4000)]
    assert depth == [50, 100, 169, 283]  # one per 10 tokens up to 1,000, then as the budget to the power 0.75
    linear = replace(CONTEXT_READ, depth_exponent=1.0)
    assert [linear.candidate_counts(b, FUSED_TURNS)[0].top_k for b in (2000, 4000)] == [200, 400]


def test_a_turn_in_its_own_offset_resolves_its_dates_on_its_own_day():
    # 23:30 UTC on Monday is Tuesday 00:30 at +01:00: "yesterday" is that Monday.
    turn = RetrievedTurn(conversation_id="c", turn_id="t", speaker="Bo", text="I ran yesterday.",
                         ts=datetime(2024, 3, 18, 23, 30, tzinfo=UTC), session_id=None, score=0.1, dense_rank=1,
                         lexical_rank=None, tz_offset_s=3600)
    candidate = with_dates(turn_candidate(turn))
    assert candidate.fields["time"].tzinfo == timezone(timedelta(hours=1))
    assert candidate.fields["dates"][0].start == date(2024, 3, 18)
    assert candidate.body.endswith("[yesterday = 2024-03-18]") and with_dates(candidate) is candidate


def test_dates_are_resolved_only_for_lines_that_may_fit(monkeypatch):
    import epistream.consumers.packing as packing

    resolved: list[str] = []
    real = packing._said_dates
    monkeypatch.setattr(packing, "_said_dates", lambda text, said: resolved.append(text) or real(text, said))
    fits = turn_candidate(_turn(1, "I ran yesterday.", score=0.2))
    too_long = turn_candidate(_turn(2, "I swam yesterday. " + "x" * 4000, score=0.1))
    (item,) = pack(rank([fits, too_long]), 100).items
    assert item.turn_id == "t1" and [d.expression for d in item.dates] == ["yesterday"]
    assert resolved == ["I ran yesterday."]  # the line that could never fit was not resolved


def test_a_gists_source_turn_ranks_just_below_it_and_a_better_hit_of_the_same_turn_wins():
    gist = gist_candidate(_gist(1, "2024-03-13: Alice moved to Lisbon."), 1, 30)
    source = source_candidate(_turn(1, "I moved to Lisbon last Wednesday.", score=0.0), gist, 1, 0.9)
    assert source.score == gist.score * 0.9 and source.fields["scores"]["source_of_gist"] == 1.0
    assert [c.kind for c in rank([source, gist])] == ["gist", "turn"]
    found = turn_candidate(_turn(1, "I moved to Lisbon last Wednesday.", score=1.0))
    (kept,) = [c for c in rank([source, found]) if c.kind == "turn"]
    assert kept.score == 1.0 and "source_of_gist" not in kept.fields["scores"]
