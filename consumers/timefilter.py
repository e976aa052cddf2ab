"""What a question says about time, understood once per read (``QuestionTime``): the caller's
explicit ``time_range`` (a hard filter: nothing outside it is read), the period the question names
("in May 2023", "in 2022", "last week"; resolved against when it was asked, as a half-open range of
instants), whether it asks about a state ("where did Alice live") and about the past. Every reader
takes the result: the context read and fast mode (consumers/context.py), deep mode, agentic mode's
tools (their anchor).

The period the question names filters nothing: memory about it ranks first (``QuestionTime.about``
and ``said_about``), everything else after. A period whose bounds leave the calendar (this year,
asked on 9999-12-31) is no period: the arithmetic goes through `epistream.core.dates.within_calendar`,
the one guard."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from epistream.contracts.questions import Question, TimeRange
from epistream.contracts.replies import ResolvedPeriod
from epistream.core.dates import RELATIVE_PATTERN, Precision, ResolvedDate, relative_dates, resolve, within_calendar

_MONTHS = "|".join(calendar.month_name[1:])
# Explicit periods: "in May 2023", "during June, 2022", "in 2021", "May 2023".
ABSOLUTE_PERIOD = re.compile(
    rf"\b(?:(?:in|during|of)\s+)?(?:(?P<month>{_MONTHS})\s*,?\s+)?(?P<year>(?:19|20)\d{{2}})\b", re.IGNORECASE
)
# Relative periods wide enough to filter by: a day/week/month/year said relative to now.
_RELATIVE_PERIODS = re.compile(r"\b(last|this|past|previous)\s+(week|month|year)\b|\byesterday\b|\btoday\b",
                               re.IGNORECASE)


@dataclass(frozen=True)
class DateRange:
    start: datetime
    end: datetime  # exclusive

    @classmethod
    def of(cls, resolved: ResolvedDate) -> DateRange | None:
        """The period a resolved date stands for; None when its exclusive end is past the calendar."""
        return within_calendar(lambda: cls._span(resolved))

    @classmethod
    def _span(cls, resolved: ResolvedDate) -> DateRange:
        first = resolved.value
        if resolved.precision == "year":
            first, last = date(first.year, 1, 1), date(first.year + 1, 1, 1)
        elif resolved.precision == "month":
            first = first.replace(day=1)
            last = (first + timedelta(days=32)).replace(day=1)
        elif resolved.precision == "week":
            first = first - timedelta(days=first.weekday())
            last = first + timedelta(days=7)
        else:
            last = first + timedelta(days=1)
        return cls(datetime.combine(first, time(), UTC), datetime.combine(last, time(), UTC))


    @property
    def days(self) -> tuple[date, date]:
        """The calendar days it covers, first and last (inclusive), in UTC."""
        return self.start.astimezone(UTC).date(), last_day(self.end)


def last_day(end: datetime) -> date:
    """The last UTC calendar day of the instants before ``end`` (a range that ends at midnight ends the day before)."""
    return (end.astimezone(UTC) - timedelta(microseconds=1)).date()


def day_span(start: datetime | None, end: datetime | None) -> tuple[date | None, date | None]:
    """Instants [start, end) as UTC calendar days [first, last], either end open (None)."""
    return None if start is None else start.astimezone(UTC).date(), None if end is None else last_day(end)


@dataclass(frozen=True)
class Period:
    """A question's period: the words that name it, how precisely, and the range they stand for."""

    expression: str
    precision: Precision
    range: DateRange


def find_period(question: str, asked_at: datetime | None) -> Period | None:
    """The period a question restricts itself to, if it names exactly one, with the words naming it."""
    anchor = asked_at or datetime.now(UTC)
    match = ABSOLUTE_PERIOD.search(question)
    if match:
        text = f"{match.group('month') or ''} {match.group('year')}".strip()
        return _period(match.group(0).strip(), text, anchor)
    relative = _RELATIVE_PERIODS.search(question)
    if relative and RELATIVE_PATTERN.search(relative.group(0)):
        return _period(relative.group(0), relative.group(0), anchor)
    return None


def _period(expression: str, text: str, anchor: datetime) -> Period | None:
    resolved = resolve(text, anchor)
    window = None if resolved is None else DateRange.of(resolved)
    return None if resolved is None or window is None else Period(expression, resolved.precision, window)


def extract(question: str, asked_at: datetime | None) -> DateRange | None:
    """The period a question restricts itself to, if it names exactly one."""
    period = find_period(question, asked_at)
    return None if period is None else period.range


# Words that ask about how things were, not how they are: the facts a later one superseded answer them.
_ABOUT_THE_PAST = re.compile(
    r"\b(used to|previous(?:ly)?|former(?:ly)?|originally|at first|back then|at the time|in the past|"
    r"earlier|before|ago|no longer|any ?more|history|until)\b", re.IGNORECASE)


def asks_about_past(question: str, window_end: datetime | None, asked_at: datetime) -> bool:
    """Whether a question asks how things were: it says so ("used to", "before", "in 2022" ...),
    or the period it reads ends before it was asked."""
    return bool(_ABOUT_THE_PAST.search(question)) or (window_end is not None and window_end <= asked_at)


def period_of(expression: str, resolved: ResolvedDate, *, filters: bool = False) -> ResolvedPeriod | None:
    """A resolved date as the calendar days it stands for (None when they leave the calendar)."""
    window = DateRange.of(resolved)
    return None if window is None else _as_resolved(expression, window, resolved.precision, filters=filters)


def _as_resolved(expression: str, window: DateRange, precision: Precision, *, filters: bool) -> ResolvedPeriod:
    first, last = window.days
    return ResolvedPeriod(expression=expression, start=first, end=last, precision=precision, filters=filters)


@dataclass(frozen=True)
class Window:
    """Instants [start, end), either open; ``empty`` when its bounds do not meet."""

    start: datetime | None = None
    end: datetime | None = None

    @classmethod
    def of(cls, time_range: TimeRange | None) -> Window:
        return cls() if time_range is None else cls(time_range.start, time_range.end)

    @property
    def empty(self) -> bool:
        return self.start is not None and self.end is not None and self.start >= self.end

    @property
    def days(self) -> tuple[date | None, date | None]:
        """The window as UTC calendar days [first, last] (for gists' and facts' dates)."""
        return day_span(self.start, self.end)

    def meet(self, other: DateRange) -> Window:
        """The instants in both."""
        return Window(other.start if self.start is None else max(self.start, other.start),
                      other.end if self.end is None else min(self.end, other.end))


#: The first instant of the calendar: a state question's evidence may have been said any time before its period ends.
CALENDAR_START = datetime.min.replace(tzinfo=UTC)

# A question about a state that holds for a while (where someone lives or works, their job, their partner), not
# about an event: "Where did Alice live in February 2024?" is answered by the last home she named before March.
_STATE_WORDS = re.compile(
    r"\b(?:live[sd]?|living|resid(?:e[sd]?|ing|ence)|stay(?:s|ed|ing)?|based|address|"
    r"work(?:s|ed|ing)?|employ(?:ed|er|ment)|jobs?|occupation|profession|career|"
    r"married|dating|partner|boyfriend|girlfriend|husband|wife)\b", re.IGNORECASE)
# ... unless it asks when something happened, or how many or how often: those are about events.
_EVENT_QUESTION = re.compile(r"^\W*(?:when|how\s+(?:long|many|much|often))\b|\b(?:start(?:ed)?|began|begin|"
                             r"quit|left|move[sd]?|moving)\b", re.IGNORECASE)


def asks_about_state(question: str) -> bool:
    """Whether a question asks about a state ("where did X live", "what was X's job", "where does X
    work"), whose evidence is the latest statement of it, not something said during the period."""
    return bool(_STATE_WORDS.search(question)) and not _EVENT_QUESTION.search(question)


@dataclass(frozen=True)
class QuestionTime:
    """What a question says about time, understood once per read (``understand``).

    ``asked``: the caller's explicit ``time_range``, a hard filter (nothing said outside it is read).
    ``period``: the one period the question names, understood from its words; it filters nothing:
    memory about it ranks first. ``state``: the question asks about a state, so everything said before
    the period's end may hold then. ``resolved``: the question's date expressions (the reply's
    ``resolved``; the period marked ``filters``, the one the read ranks by)."""

    asked_at: datetime
    asked: Window = Window()
    period: Period | None = None
    state: bool = False
    past: bool = False
    resolved: tuple[ResolvedPeriod, ...] = field(default=())

    @classmethod
    def of(cls, question: Question) -> QuestionTime:
        return understand(question.question, question.asked_at, question.time_range)

    def said_about(self, told_later: timedelta = timedelta(0)) -> DateRange | None:
        """The instants in which a turn said is about the period: the period itself, and ``told_later``
        after it when given; for a state question, everything before the period's end (the latest
        statement of the state holds then). None when the question names no period."""
        if self.period is None:
            return None
        span = self.period.range
        end = within_calendar(lambda: span.end + told_later) or span.end
        return DateRange(CALENDAR_START if self.state else span.start, end)

    @property
    def about_days(self) -> tuple[date, date] | None:
        """The period as UTC days [first, last]; a state question's from the calendar's start."""
        if self.period is None:
            return None
        first, last = self.period.range.days
        return (date.min if self.state else first), last

    def is_about(self, first: date, last: date) -> bool:
        """Whether something spanning the days [first, last] is about the period."""
        days = self.about_days
        return days is not None and first <= days[1] and last >= days[0]


def understand(question: str, asked_at: datetime | None, time_range: TimeRange | None = None) -> QuestionTime:
    """The question's time, resolved against when it was asked (now when not given)."""
    anchor = asked_at or datetime.now(UTC)
    asked = Window.of(time_range)
    period = find_period(question, anchor)
    ends = [end for end in (asked.end, None if period is None else period.range.end) if end is not None]
    return QuestionTime(asked_at=anchor, asked=asked, period=period, state=asks_about_state(question),
                        past=asks_about_past(question, min(ends, default=None), anchor),
                        resolved=tuple(question_periods(question, anchor, period)))


def question_periods(question: str, asked_at: datetime, period: Period | None) -> list[ResolvedPeriod]:
    """The question's date expressions resolved against when it was asked; the period the read ranks
    by (``period``) marked ``filters``."""
    found = [period_of(expression, resolved) for expression, resolved in relative_dates(question, asked_at)]
    periods = [p for p in found if p is not None]
    if period is not None:
        ranking = _as_resolved(period.expression, period.range, period.precision, filters=True)
        periods = [p for p in periods if p.expression.lower() != period.expression.lower()] + [ranking]
    return periods
