"""Time filters read from a question ("in May 2023", "in 2022", "last year"),
resolved against when it was asked, as a half-open range of instants.

A period whose bounds leave the calendar (this year, asked on 9999-12-31) is no filter:
the arithmetic goes through `epistream.dates.within_calendar`, the one guard."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from epistream.dates import RELATIVE_PATTERN, ResolvedDate, resolve, within_calendar

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


def extract(question: str, asked_at: datetime | None) -> DateRange | None:
    """The period a question restricts itself to, if it names exactly one."""
    anchor = asked_at or datetime.now(UTC)
    match = ABSOLUTE_PERIOD.search(question)
    if match:
        text = f"{match.group('month') or ''} {match.group('year')}".strip()
        resolved = resolve(text, anchor)
        return None if resolved is None else DateRange.of(resolved)
    relative = _RELATIVE_PERIODS.search(question)
    if relative and RELATIVE_PATTERN.search(relative.group(0)):
        resolved = resolve(relative.group(0), anchor)
        return None if resolved is None else DateRange.of(resolved)
    return None
