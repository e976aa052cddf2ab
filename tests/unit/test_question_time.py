"""A question's time, understood once (consumers/timefilter.QuestionTime), and how the context read
ranks what is about its period first (consumers/context.py): no services."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from epistream.consumers.context import (
    Found,
    best_first,
    fact_is_about,
    found_turn,
    gist_is_about,
    weighted,
)
from epistream.consumers.modes.deep import TOLD_LATER, period_first, window_for
from epistream.consumers.packing import gist_candidate, turn_candidate
from epistream.consumers.retrieval import PERIOD_BOOST, NamedFact, NearGist, RetrievedTurn
from epistream.consumers.timefilter import CALENDAR_START, DateRange, asks_about_state, understand
from epistream.contracts.questions import Mode, Question, TimeRange

ASKED = datetime(2024, 12, 14, 12, 0, tzinfo=UTC)
FEBRUARY = DateRange(datetime(2024, 2, 1, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC))


def _turn(turn_id: str, text: str, ts: datetime, score: float = 0.05) -> RetrievedTurn:
    return RetrievedTurn(conversation_id="c", turn_id=turn_id, speaker="Alice", text=text, ts=ts, session_id=None,
                         score=score, dense_rank=1, lexical_rank=None)


@pytest.mark.parametrize("question", [
    "Where did Alice live in February 2024?", "Where does Alice work?", "What was Alice's job in 2023?",
    "Where was Bob living last year?", "Who was Caroline dating in May 2023?", "What is Alice's occupation?",
])
def test_questions_about_a_state(question):
    assert asks_about_state(question)


@pytest.mark.parametrize("question", [
    "What did Alice do last week?", "When did Alice start working at Grão Coffee Roasters?",
    "How many races did Alice run in 2024?", "Where did Alice move in March?", "What did Alice bake in 2024?",
])
def test_questions_about_events(question):
    assert not asks_about_state(question)


def test_the_question_is_understood_once_with_its_period_its_kind_and_the_callers_range_apart():
    when = understand("Where did Alice live in February 2024?", ASKED)
    assert when.period is not None and when.period.range == FEBRUARY and when.state and when.past
    assert when.asked.start is None and when.asked.end is None  # nothing filters
    assert [(p.expression, p.start, p.end, p.filters) for p in when.resolved] == [
        ("in February 2024", date(2024, 2, 1), date(2024, 2, 29), True)]
    # A state holds from whenever it was last said: everything said before the period's end is about it.
    assert when.said_about() == DateRange(CALENDAR_START, FEBRUARY.end)
    assert when.about_days == (date.min, date(2024, 2, 29))

    event = understand("What did Alice do in February 2024?", ASKED, TimeRange(start=datetime(2024, 1, 1, tzinfo=UTC)))
    assert not event.state and event.said_about() == FEBRUARY
    assert event.said_about(timedelta(days=31)) == DateRange(FEBRUARY.start, datetime(2024, 4, 1, tzinfo=UTC))
    assert event.asked.start == datetime(2024, 1, 1, tzinfo=UTC)  # the caller's range: the one hard filter
    assert event.is_about(date(2024, 1, 20), date(2024, 2, 1)) and not event.is_about(date(2024, 3, 1), date(2024, 3, 2))

    plain = understand("Where does Alice live?", ASKED)
    assert plain.period is None and plain.said_about() is None and not plain.is_about(date.min, date.max)
    assert not plain.past


def test_deep_mode_reads_the_same_understanding():
    question = Question(question_id="q", tenant="t", question="What did Alice do in February 2024?", asked_at=ASKED,
                        mode=Mode.DEEP)
    assert window_for(question) == DateRange(FEBRUARY.start, FEBRUARY.end + TOLD_LATER)
    found = [_turn("a", "x", ASKED), _turn("b", "y", ASKED)]
    assert [t.turn_id for t in period_first([found[1]], found)] == ["b", "a"]


def test_a_turn_is_about_the_period_when_said_in_it_or_when_its_dates_fall_in_it():
    when = understand("What did Alice do in February 2024?", ASKED)
    said_about = when.said_about()
    inside = found_turn(turn_candidate(_turn("t1", "I baked bread.", datetime(2024, 2, 10, tzinfo=UTC))), when,
                        said_about)
    told_later = found_turn(turn_candidate(_turn("t2", "I baked bread last month.", datetime(2024, 3, 5, tzinfo=UTC))),
                            when, said_about)
    elsewhere = found_turn(turn_candidate(_turn("t3", "I baked bread yesterday.", datetime(2024, 6, 5, tzinfo=UTC))),
                           when, said_about)
    assert inside.about and told_later.about and not elsewhere.about
    assert told_later.candidate.dated and told_later.candidate.fields["dates"][0].start == date(2024, 2, 1)
    assert "[last month = " in told_later.candidate.body  # resolved once, here; packing keeps it


def _gist_of(first: date, last: date, *, text: str = "A gist.", distance: float = 0.2) -> NearGist:
    """A gist row whose event is the days [first, last] (the span retrieval.fragments.gist_days gives it)."""
    return NearGist(gist_id="g", conversation_id="c", segment_id="s", text=text, event_date=first,
                    date_precision="day", turn_ids=["t1"], said_at=ASKED, first_day=first, last_day=last,
                    distance=distance)


def test_gists_and_facts_about_the_period():
    event = understand("What did Alice do in February 2024?", ASKED)
    state = understand("Where did Alice live in February 2024?", ASKED)
    # The rows carry the days their query gives them (retrieval.fragments.gist_days / fact_days).
    assert gist_is_about(_gist_of(date(2024, 2, 1), date(2024, 2, 29)), event)
    assert not gist_is_about(_gist_of(date(2024, 1, 17), date(2024, 1, 17)), event)
    assert gist_is_about(_gist_of(date(2024, 1, 17), date(2024, 1, 17)), state)  # before its end

    def fact(point=None, start=None, end=None, said=datetime(2024, 1, 17, tzinfo=UTC)):
        first = point or start or (None if end is not None else said.date())
        last = point or end or (None if start is not None else said.date())
        return NamedFact(fact_id="f", conversation_id="c", segment_id="s", subject="Alice", predicate="lives_in",
                         object="Porto", point_in_time=point, start_time=start, end_time=end, turn_ids=["t1"],
                         said_at=said, first_day=first, last_day=last, current=True)

    assert fact_is_about(fact(start=date(2019, 1, 1), end=date(2024, 3, 1)), event)  # held then
    assert fact_is_about(fact(start=date(2024, 1, 1)), event)  # open: still holds
    assert not fact_is_about(fact(start=date(2019, 1, 1), end=date(2023, 12, 31)), state)  # ended before
    assert not fact_is_about(fact(), event)  # undated, said in January: an event of then
    assert fact_is_about(fact(), state)  # ... but a state said in January still holds in February
    assert not fact_is_about(fact(said=datetime(2024, 3, 23, tzinfo=UTC)), state)  # said after the period


def test_what_is_about_the_period_ranks_first_and_the_rest_stays_after_it():
    strong = Found(turn_candidate(_turn("strong", "x", ASKED, score=0.06)), about=False)
    weak = Found(turn_candidate(_turn("weak", "y", ASKED, score=0.01)), about=True)
    assert weak.ranked.score == pytest.approx(0.01 + PERIOD_BOOST) and weak.ranked.fields["scores"]["period"] == 1.0
    assert strong.ranked is strong.candidate
    # The same turn found twice (in the period's search and the whole memory's) is kept once, at its best.
    again = Found(turn_candidate(_turn("weak", "y", ASKED, score=0.03)), about=True)
    ordered = best_first([strong, weak, again])
    assert [f.candidate.fields["turn_id"] for f in ordered] == ["weak", "strong"]
    assert ordered[0].candidate.score == 0.03


def test_enrichment_ranked_last_stays_after_every_turn_of_its_standing_but_before_those_outside_the_period():
    gist = gist_candidate(_gist_of(ASKED.date(), ASKED.date(), text="Alice moved to Porto.", distance=0.1), 1, 30)
    turn = Found(turn_candidate(_turn("weak", "y", ASKED, score=0.001)), about=False)
    last = weighted(Found(gist, about=False), 0.0)
    assert last.candidate.score == 0.0 and weighted(Found(gist, about=False), 1.0).candidate is gist
    assert [f.candidate.kind for f in best_first([last, turn])] == ["turn", "gist"]
    # About the period, it still ranks before what is not.
    assert [f.candidate.kind for f in best_first([weighted(Found(gist, about=True), 0.0), turn])] == ["gist", "turn"]
