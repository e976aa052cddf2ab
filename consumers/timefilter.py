"""Time filters read from a question ("in May 2023", "in 2022", "last year"),
resolved against when it was asked, as a half-open range of instants.

A period whose bounds leave the calendar (this year, asked on 9999-12-31) is no filter:
the arithmetic goes through `epistream.dates.within_calendar`, the one guard."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from epistream.dates import RELATIVE_PATTERN, Precision, ResolvedDate, resolve, within_calendar

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
    first = None if start is None else start.astimezone(UTC).date()
    last = None if end is None else (end.astimezone(UTC) - timedelta(microseconds=1)).date()
    return first, last


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
