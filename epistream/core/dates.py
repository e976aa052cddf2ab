"""Deterministic parsing and repair of the dates a model writes into gists and fact qualifiers.

Model output is unreliable, so every date is re-derived here, anchored at the time of the
dialogue turn it came from (the anchor's own *local* date, never UTC: a turn at 00:30+01:00
on 1 January happened on 1 January for the speaker).

Rules for ambiguous weekday expressions (weeks start on Monday):

* ``last <weekday>``, ``this past <weekday>``, ``on <weekday>`` and a bare ``<weekday>``: the
  most recent such day strictly before the anchor date (1-7 days back), so "last Wednesday"
  said on a Wednesday is 7 days earlier. In a running text (``relative_dates``, ``absolutize``),
  ``on <weekday>`` and a bare ``<weekday>`` in a sentence about the future (another expression of
  it resolves after the anchor, or it says will / 'll / going to / gonna) and with no past-tense
  verb are the first such day strictly after the anchor: "the wedding is this Saturday, so I fly
  back on Friday", said on a Wednesday, is two days later.
* ``this <weekday>``: that day of the anchor's own Monday-Sunday week (may be in the past).
* ``next <weekday>``: that day of the following Monday-Sunday week ("next Saturday" said on
  Wednesday 2024-01-17 is 2024-01-27, not 2024-01-20).
* ``coming <weekday>`` / ``this coming <weekday>``: the first such day strictly after the anchor.
* ``last|this|next weekend``: the Saturday of the previous/current/next week; ``this past
  weekend`` is the most recent Saturday strictly before the anchor, ``this coming weekend``
  the first Saturday strictly after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import wraps
from typing import Literal, ParamSpec, TypeVar

from dateparser.date import DateDataParser
from dateutil.relativedelta import relativedelta

Precision = Literal["day", "week", "month", "year"]

T = TypeVar("T")
P = ParamSpec("P")


def within_calendar(compute: Callable[[], T]) -> T | None:
    """The one guard on date arithmetic: a result before year 1 or after year 9999 is no date (None).

    ``date``/``timedelta``/``relativedelta`` raise OverflowError or ValueError there, and a question
    asked at 9999-12-31 or a turn stamped 0001-01-01 is valid input: it must resolve to nothing,
    never stop a worker. Every computation on a date read from input goes through here.
    """
    try:
        return compute()
    except (OverflowError, ValueError):
        return None


def _in_calendar(function: Callable[P, T | None]) -> Callable[P, T | None]:
    @wraps(function)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> T | None:
        return within_calendar(lambda: function(*args, **kwargs))
    return guarded


@dataclass(frozen=True)
class ResolvedDate:
    """A calendar date plus how precisely the source text pinned it down."""

    value: date
    precision: Precision


_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBER_WORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
}  # fmt: skip
_DAY_WORDS = {
    "the day before yesterday": -2, "the day after tomorrow": 2, "yesterday": -1, "last night": -1,
    "today": 0, "tonight": 0, "now": 0, "right now": 0, "this morning": 0, "this afternoon": 0,
    "this evening": 0, "tomorrow": 1,
}  # fmt: skip
_MONTH_NAMES = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip
_MONTH_NUMBERS = {name[:3]: i for i, name in enumerate(_MONTH_NAMES, start=1)}

_WD = "(?:" + "|".join(_WEEKDAYS) + ")"
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
# Longest first so "seventeen" is not read as "seven"; "a couple (of)" means two.
_NUM = r"(?:\d{1,3}|a\s+couple(?:\s+of)?|" + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True)) + ")"
_UNIT = r"(?:minute|hour|day|week|month|year)s?"
# A weekday directly followed by a date ("on Wednesday, 17 January") is already absolute.
_WD_UNDATED = rf"{_WD}(?!,?\s+(?:the\s+)?\d)(?!,?\s+{_MONTH}\b)"

_RELATIVE_ALTERNATIVES = (
    r"the\s+day\s+(?:before\s+yesterday|after\s+tomorrow)",
    r"yesterday|today|tonight|tomorrow|last\s+night|this\s+(?:morning|afternoon|evening)",
    rf"(?:last|next|this(?:\s+(?:past|coming))?|coming|on)\s+{_WD_UNDATED}",
    r"(?:last|next|this(?:\s+(?:past|coming))?)\s+(?:weekend|week|month|year)",
    rf"{_NUM}\s+{_UNIT}\s+(?:ago|from\s+now)",
    rf"in\s+{_NUM}\s+{_UNIT}",
)
# A parenthesised date right after an expression marks it as already absolutized.
_ALREADY_DATED = r"(?!\s*\(\d{4}(?:-\d{2}){0,2}\))"
RELATIVE_PATTERN = re.compile(
    r"(?<![\w-])(?:" + "|".join(_RELATIVE_ALTERNATIVES) + r")(?![\w'’-])" + _ALREADY_DATED,
    re.IGNORECASE,
)

_WEEKDAY_EXPR = re.compile(rf"(?:(?P<mod>last|next|this(?:\s+(?:past|coming))?|coming|on)\s+)?(?P<wd>{_WD})")
_PERIOD_EXPR = re.compile(r"(?P<mod>last|next|this(?:\s+(?:past|coming))?)\s+(?P<unit>weekend|week|month|year)")
_COUNT_EXPR = re.compile(
    rf"(?P<in>in\s+)?(?P<n>{_NUM})\s+(?P<unit>minute|hour|day|week|month|year)s?"
    r"(?:\s+(?P<dir>ago|from\s+now))?"
)
_QUALIFIER = re.compile(r"^(?:on|in|at|around|about|approximately|approx\.?|circa|c\.|roughly|during)\s+")
_ISO = re.compile(r"(?P<y>\d{4})-(?P<m>\d{2})(?:-(?P<d>\d{2})(?:[T ]\d{1,2}:\d{2}\S*)?)?")
_YEAR = re.compile(r"\d{4}")
_NUMERIC_DATE = re.compile(r"\d{1,4}[/.-]\d{1,2}[/.-]\d{1,4}")
# Words allowed around a written date; anything else means the value is not (only) a date.
_DATE_WORDS = frozenset(
    {"of", "the", "on", "st", "nd", "rd", "th", "at", "am", "pm", "t", "z", "utc", "gmt", "sept"}
    | set(_WEEKDAYS)
    | {w[:3] for w in _WEEKDAYS}
    | set(_MONTH_NAMES)
    | set(_MONTH_NUMBERS)
)
_PERIOD_PRECISION: dict[str, Precision] = {"week": "week", "month": "month", "year": "year"}


def _monday(d: date) -> date:
    return d - timedelta(days=d.weekday())


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _calendar_offset(unit: str, n: int) -> relativedelta:
    """``n`` of a calendar unit (day, week, month or year) as a relativedelta."""
    match unit:
        case "day":
            return relativedelta(days=n)
        case "week":
            return relativedelta(weeks=n)
        case "month":
            return relativedelta(months=n)
        case "year":
            return relativedelta(years=n)
    raise ValueError(f"not a calendar unit: {unit!r}")


def _count(word: str) -> int:
    word = _norm(word)
    if word.isdigit():
        return int(word)
    return 2 if word.startswith("a couple") else _NUMBER_WORDS[word]


def _resolve_weekday(mod: str | None, wd: int, d: date) -> date:
    if mod == "this":
        return _monday(d) + timedelta(days=wd)
    if mod == "next":
        return _monday(d) + timedelta(days=7 + wd)
    if mod in ("coming", "this coming"):
        return d + timedelta(days=(wd - d.weekday()) % 7 or 7)
    return d - timedelta(days=(d.weekday() - wd) % 7 or 7)  # last / this past / on / bare


def _resolve_period(mod: str, unit: str, d: date) -> ResolvedDate:
    if unit == "weekend":
        if mod == "this past":
            return ResolvedDate(_resolve_weekday("last", 5, d), "week")
        if mod == "this coming":
            return ResolvedDate(_resolve_weekday("coming", 5, d), "week")
        weeks = {"last": -1, "this": 0, "next": 1}[mod]
        return ResolvedDate(_monday(d) + timedelta(days=7 * weeks + 5), "week")
    sign = {"last": -1, "this past": -1, "this": 0, "next": 1, "this coming": 1}[mod]
    return ResolvedDate(d + _calendar_offset(unit, sign), _PERIOD_PRECISION[unit])


@_in_calendar
def _resolve_relative(text: str, anchor: datetime) -> ResolvedDate | None:
    """Resolve a whole relative expression (no surrounding words) against the anchor."""
    s = _norm(text)
    d = anchor.date()
    if s in _DAY_WORDS:
        return ResolvedDate(d + timedelta(days=_DAY_WORDS[s]), "day")
    if m := _WEEKDAY_EXPR.fullmatch(s):
        return ResolvedDate(_resolve_weekday(m["mod"], _WEEKDAYS.index(m["wd"]), d), "day")
    if m := _PERIOD_EXPR.fullmatch(s):
        return _resolve_period(" ".join(m["mod"].split()), m["unit"], d)
    m = _COUNT_EXPR.fullmatch(s)
    if m is None or bool(m["in"]) == bool(m["dir"]):  # exactly one of "in N" / "N ago|from now"
        return None
    n = _count(m["n"]) * (-1 if m["dir"] == "ago" else 1)
    unit = m["unit"]
    if unit in ("minute", "hour"):
        # Sub-day offsets can cross midnight, so compute them on the local wall-clock time.
        return ResolvedDate((anchor + timedelta(**{unit + "s": n})).date(), "day")
    return ResolvedDate(d + _calendar_offset(unit, n), "day" if unit == "day" else _PERIOD_PRECISION[unit])


@_in_calendar
def _resolve_absolute(s: str, anchor: datetime) -> ResolvedDate | None:
    # "2024-02-30" or "0000" is no date: the guard turns date()'s ValueError into None.
    if m := _ISO.fullmatch(s):
        if m["d"] is None:
            return ResolvedDate(date(int(m["y"]), int(m["m"]), 1), "month")
        # The date as written: models copy the turn's stamp, so no timezone conversion.
        return ResolvedDate(date(int(m["y"]), int(m["m"]), int(m["d"])), "day")
    if _YEAR.fullmatch(s):
        return ResolvedDate(date(int(s), 1, 1), "year")
    # dateparser reads almost anything ("3" is a month), so only hand it text made of date words.
    if any(w not in _DATE_WORDS for w in re.findall(r"[a-z]+", s)):
        return None
    if not (re.search(rf"\b{_MONTH}\b", s) or _NUMERIC_DATE.search(s)):
        return None
    prefer = "future" if re.match(r"(?:next|in|coming|this coming)\b", s) else "past"
    parser = DateDataParser(
        languages=["en"],
        settings={
            "RELATIVE_BASE": anchor.replace(tzinfo=None),
            "PREFER_DATES_FROM": prefer,
            "PREFER_DAY_OF_MONTH": "first",
            "STRICT_PARSING": False,
            "RETURN_AS_TIMEZONE_AWARE": False,
        },
    )
    data = parser.get_date_data(s)
    if data is None or data.date_obj is None:
        return None
    value = data.date_obj.date()
    if data.period == "year":
        return ResolvedDate(value.replace(month=1, day=1), "year")
    if data.period == "month":
        return ResolvedDate(value.replace(day=1), "month")
    return ResolvedDate(value, "week" if data.period == "week" else "day")


def resolve(value: str | None, anchor: datetime) -> ResolvedDate | None:
    """Resolve what a model wrote as a date, relative to the turn time ``anchor``; None if unusable.

    Month-only and year-only inputs resolve to the first day of the month/year; relative
    month/year offsets keep the anchor's day (calendar-safe: 2024-02-29 minus a year is 2023-02-28).
    """
    if not isinstance(value, str):
        return None
    s = _norm(value).strip(" \t\"'“”‘’.,;:!?")
    while s:
        found = _resolve_relative(s, anchor) or _resolve_absolute(s, anchor)
        if found is not None:
            return found
        stripped = _QUALIFIER.sub("", s, count=1)  # "around May 2023", "about three weeks ago"
        if stripped == s:
            return None
        s = stripped
    return None


def parse_date(value: str | None, anchor: datetime) -> date | None:
    """The date ``value`` denotes relative to ``anchor``, without its precision."""
    resolved = resolve(value, anchor)
    return resolved.value if resolved else None


def format_resolved(r: ResolvedDate) -> str:
    """ISO text at the resolved precision: 2024-01-17 (day/week), 2024-01 (month), 2024 (year)."""
    if r.precision == "year":
        return f"{r.value.year:04d}"
    if r.precision == "month":
        return f"{r.value.year:04d}-{r.value.month:02d}"
    return r.value.isoformat()


_SENTENCE = re.compile(r"[^.!?]+[.!?]*")
_FUTURE_WORDS = re.compile(r"\b(?:will|shall|going\s+to|gonna)\b|\w'll\b|\w’ll\b", re.IGNORECASE)
# A past-tense verb anywhere in the sentence keeps a bare weekday in the past (the safe reading).
_PAST_WORDS = re.compile(
    r"\b(?:was|were|did|had|went|came|got|ran|flew|saw|met|left|took|made|said|told|bought|found|gave|"
    r"began|won|lost|spent|felt|thought|heard|wrote|ate|drove|sent|\w{2,}(?<!e)ed)\b", re.IGNORECASE)
_BARE_WEEKDAY = re.compile(rf"(?:on\s+)?{_WD}", re.IGNORECASE)


def _resolved_in(text: str, anchor: datetime) -> list[tuple[re.Match[str], ResolvedDate | None]]:
    """Each relative expression of ``text`` with its date, a bare weekday read with its sentence's
    tense (the module's rules): the one place ``relative_dates`` and ``absolutize`` resolve."""
    out: list[tuple[re.Match[str], ResolvedDate | None]] = []
    if not RELATIVE_PATTERN.search(text):  # most turns: nothing to resolve, no sentences to split
        return out
    today = anchor.date()
    for sentence in _SENTENCE.finditer(text):
        found = [(m, _resolve_relative(m.group(0), anchor), _BARE_WEEKDAY.fullmatch(_norm(m.group(0))))
                 for m in RELATIVE_PATTERN.finditer(text, sentence.start(), sentence.end())]
        # The sentence's tense is read only when it has a bare weekday to place.
        ahead = any(w for _, _, w in found) and not _PAST_WORDS.search(sentence.group(0)) and (
            bool(_FUTURE_WORDS.search(sentence.group(0)))
            or any(r is not None and r.value > today and not w for _, r, w in found))
        for m, resolved, w in found:
            if ahead and resolved is not None and w:
                weekday = _WEEKDAYS.index(w.group(0).split()[-1])
                resolved = ResolvedDate(_resolve_weekday("coming", weekday, today), "day")
            out.append((m, resolved))
    return out


def relative_dates(text: str, anchor: datetime) -> list[tuple[str, ResolvedDate]]:
    """Each relative expression in ``text`` (the ones ``absolutize`` annotates), with the date it
    stands for said at ``anchor``; expressions that resolve to nothing are left out."""
    return [(m.group(0), resolved) for m, resolved in _resolved_in(text, anchor) if resolved is not None]


def absolutize(text: str, anchor: datetime) -> str:
    """Append the resolved date in parentheses after each relative expression in ``text``.

    The original words stay so the quote remains readable and auditable; expressions already
    followed by a parenthesised date are left alone, which makes this idempotent.
    """

    parts, last = [], 0
    for m, resolved in _resolved_in(text, anchor):
        parts.append(text[last:m.end()] + (f" ({format_resolved(resolved)})" if resolved else ""))
        last = m.end()
    return "".join(parts) + text[last:]


_DAY = r"(?P<{d}>\d{{1,2}})(?:st|nd|rd|th)?"
_LEADING = re.compile(
    r"\s*(?:"
    r"[\[(]\s*(?P<by>\d{4})-(?P<bm>\d{2})-(?P<bd>\d{2})\s*[\])]"
    r"|(?P<iy>\d{4})-(?P<im>\d{2})-(?P<id>\d{2})(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|(?P<my>\d{4})-(?P<mm>\d{2})(?=\s*:)"  # month/year-only stamps need a colon: "2024-01: ..."
    r"|(?P<yy>\d{4})(?=\s*:)"
    rf"|(?P<wm0>{_MONTH})\.?,?\s+(?P<wy0>\d{{4}})(?=\s*:)"  # "May 2023: ..."
    rf"|(?:on\s+)?(?:{_WD},?\s+)?(?:the\s+)?{_DAY.format(d='wd1')}(?:\s+of)?\s+(?P<wm1>{_MONTH})\.?,?\s+(?P<wy1>\d{{4}})"
    rf"|(?:on\s+)?(?:{_WD},?\s+)?(?P<wm2>{_MONTH})\.?\s+{_DAY.format(d='wd2')},?\s+(?P<wy2>\d{{4}})"
    r")(?=[\s:,;|.\-–—]|$)",
    re.IGNORECASE,
)


def _leading_match_date(m: re.Match[str]) -> date:
    if m["by"]:
        return date(int(m["by"]), int(m["bm"]), int(m["bd"]))
    if m["iy"]:
        return date(int(m["iy"]), int(m["im"]), int(m["id"]))
    if m["my"]:
        return date(int(m["my"]), int(m["mm"]), 1)
    if m["yy"]:
        return date(int(m["yy"]), 1, 1)
    if m["wm0"]:
        return date(int(m["wy0"]), _MONTH_NUMBERS[m["wm0"][:3].lower()], 1)
    day, month, year = (m["wd1"], m["wm1"], m["wy1"]) if m["wd1"] else (m["wd2"], m["wm2"], m["wy2"])
    return date(int(year), _MONTH_NUMBERS[month[:3].lower()], int(day))


def leading_date(text: str) -> tuple[date | None, str]:
    """Split an absolute date off the start of ``text``: (date, rest) or (None, text) if there is none.

    Month- and year-only stamps ("2024-01: ...") give the first day of the month/year.
    """
    m = _LEADING.match(text)
    if m is None:
        return None, text
    found = within_calendar(lambda: _leading_match_date(m))
    if found is None:  # "2024-02-30" is not a date; leave the text alone
        return None, text
    return found, text[m.end() :].lstrip(" \t\r\n:,;|.-–—")


def gist_sentence(text: str, when: ResolvedDate, anchor: datetime) -> str:
    """The canonical gist: "<date at its precision>: <sentence>." with relative words absolutized.

    Any date the model put at the start is replaced by ``when``; relative expressions are
    resolved against the turn time ``anchor`` (not ``when``). Raises ValueError if no text is left.
    """
    rest = text
    while True:  # models sometimes stack stamps: "2024-01-17: On 17 January 2024, ..."
        found, rest = leading_date(rest)
        if found is None:
            break
    rest = " ".join(absolutize(rest, anchor).split())
    if not rest:
        raise ValueError(f"gist has no text besides its date: {text!r}")
    if not re.search(r"[.!?…][\"'”’)\]]*$", rest):
        rest += "."
    return f"{format_resolved(when)}: {rest}"
