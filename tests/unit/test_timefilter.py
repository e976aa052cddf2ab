"""The time filters read from a question, at the edges of the calendar (no services)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from epistream.consumers.modes.deep import window_for
from epistream.consumers.timefilter import DateRange, extract
from epistream.contracts.questions import Mode, Question

LAST_DAY = datetime(9999, 12, 31, tzinfo=UTC)
FIRST_DAY = datetime(1, 1, 1, tzinfo=UTC)


def test_a_period_inside_the_calendar_is_a_half_open_range():
    assert extract("What did I do in May 2023?", None) == DateRange(datetime(2023, 5, 1, tzinfo=UTC),
                                                                   datetime(2023, 6, 1, tzinfo=UTC))
    assert extract("What happened last year?", datetime(2024, 3, 1, tzinfo=UTC)) == DateRange(
        datetime(2023, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(("question", "asked_at"), [
    ("What did I do this year?", LAST_DAY), ("What did I do this month?", LAST_DAY),
    ("What did I do this week?", LAST_DAY), ("What happened today?", LAST_DAY),
    ("What happened last year?", FIRST_DAY), ("What happened yesterday?", FIRST_DAY),
])
def test_a_period_that_leaves_the_calendar_filters_nothing(question, asked_at):
    assert extract(question, asked_at) is None


def test_the_deep_window_never_overflows():
    # November 9999 is a representable period, but "said shortly after it" runs past the calendar's end.
    question = Question(question_id="q", tenant="t", question="What did I do last month?",
                        asked_at=datetime(9999, 12, 15, tzinfo=UTC), mode=Mode.DEEP)
    window = window_for(question)
    assert window is None or window.start == datetime(9999, 11, 1, tzinfo=UTC)
