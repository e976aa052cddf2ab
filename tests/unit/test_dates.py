"""Unit tests for epistream.core.dates (deterministic date parsing and gist repair; no services)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from epistream.core.dates import (
    RELATIVE_PATTERN,
    ResolvedDate,
    absolutize,
    format_resolved,
    gist_sentence,
    leading_date,
    parse_date,
    relative_dates,
    resolve,
)

CET = timezone(timedelta(hours=1))
WED = datetime(2024, 1, 17, 19, 14, tzinfo=CET)  # Wednesday; its week runs Mon 15 .. Sun 21 Jan
SUN = datetime(2024, 1, 21, 10, 0, tzinfo=CET)  # Sunday closing that same week
LEAP = datetime(2024, 2, 29, 12, 0, tzinfo=UTC)
NEW_YEAR_CET = datetime(2024, 1, 1, 0, 30, tzinfo=CET)  # still 2023-12-31 in UTC


def r(value: str | None, anchor: datetime = WED) -> tuple[str, str] | None:
    """(formatted date, precision) for compact expectations."""
    found = resolve(value, anchor)
    return None if found is None else (found.value.isoformat(), found.precision)


# --- absolute dates ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-17", date(2024, 1, 17)),
        ("2024-01-17T10:00:00Z", date(2024, 1, 17)),
        ("2023-12-31T23:30:00-05:00", date(2023, 12, 31)),  # the date as written, no tz shift
        ("2024-01-17 10:00", date(2024, 1, 17)),
        ("17 January 2024", date(2024, 1, 17)),
        ("January 17, 2024", date(2024, 1, 17)),
        ("Jan 17th, 2024", date(2024, 1, 17)),
        ("the 17th of January 2024", date(2024, 1, 17)),
        ("Wednesday, 17 January 2024", date(2024, 1, 17)),
        ("8 May, 2023", date(2023, 5, 8)),
        ("1:56 pm on 8 May, 2023", date(2023, 5, 8)),
        ("on 17 January 2024", date(2024, 1, 17)),
        ("  17 January 2024. ", date(2024, 1, 17)),
        ("17/01/2024", date(2024, 1, 17)),
    ],
)
def test_absolute_day_dates(text: str, expected: date) -> None:
    assert resolve(text, WED) == ResolvedDate(expected, "day")
    assert parse_date(text, WED) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("May 2023", ("2023-05-01", "month")),
        ("may 2023", ("2023-05-01", "month")),
        ("Dec 2023", ("2023-12-01", "month")),
        ("2023-05", ("2023-05-01", "month")),
        ("around May 2023", ("2023-05-01", "month")),
        ("in May 2023", ("2023-05-01", "month")),
        ("December", ("2023-12-01", "month")),  # no year: the most recent past December
        ("2022", ("2022-01-01", "year")),
        ("in 2022", ("2022-01-01", "year")),
    ],
)
def test_month_and_year_precision(text: str, expected: tuple[str, str]) -> None:
    assert r(text) == expected


def test_day_month_without_year_prefers_the_past() -> None:
    assert r("20 January") == ("2023-01-20", "day")
    assert r("17 January") == ("2024-01-17", "day")  # today still counts as "not future"


@pytest.mark.parametrize("text", ["2024-02-30", "2023-13", "2023-02-29T10:00:00Z", "0000"])
def test_impossible_dates_are_rejected(text: str) -> None:
    assert resolve(text, WED) is None


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "   ",
        "unknown",
        "Unknown.",
        "N/A",
        "n/a",
        "none",
        "null",
        "sometime",
        "someday",
        "recently",
        "random words",
        "the cat sat on the mat",
        "may be",
        "3",
        "soon",
        "twenty-one days ago",  # better no date than the wrong "one day ago"
        "in the summer of 2023",
        "the week before 9 June 2023",
    ],
)
def test_garbage_is_none(text: str | None) -> None:
    assert resolve(text, WED) is None
    assert parse_date(text, WED) is None


def test_non_string_is_none() -> None:
    assert resolve(20240117, WED) is None  # type: ignore[arg-type]


# --- relative day words -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("yesterday", "2024-01-16"),
        ("Yesterday", "2024-01-16"),
        ("today", "2024-01-17"),
        ("tonight", "2024-01-17"),
        ("now", "2024-01-17"),
        ("this morning", "2024-01-17"),
        ("tomorrow", "2024-01-18"),
        ("the day before yesterday", "2024-01-15"),
        ("the day after tomorrow", "2024-01-19"),
        ("last night", "2024-01-16"),
    ],
)
def test_day_words(text: str, expected: str) -> None:
    assert r(text) == (expected, "day")


# --- weekdays: last / this / next / coming / on --------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("last Wednesday", "2024-01-10"),  # anchor is a Wednesday: a full week back, never today
        ("last Tuesday", "2024-01-16"),
        ("last Monday", "2024-01-15"),
        ("last Thursday", "2024-01-11"),
        ("last Sunday", "2024-01-14"),
        ("this past Wednesday", "2024-01-10"),
        ("on Wednesday", "2024-01-10"),
        ("on Tuesday", "2024-01-16"),
        ("Friday", "2024-01-12"),
        ("this Saturday", "2024-01-20"),  # day of the current Mon-Sun week
        ("this Monday", "2024-01-15"),  # ... which can be in the past
        ("this Wednesday", "2024-01-17"),
        ("this Sunday", "2024-01-21"),
        ("next Saturday", "2024-01-27"),  # day of the following week
        ("next Monday", "2024-01-22"),
        ("next Wednesday", "2024-01-24"),
        ("coming Saturday", "2024-01-20"),  # first one strictly after the anchor
        ("this coming Saturday", "2024-01-20"),
        ("this coming Wednesday", "2024-01-24"),
        ("LAST   wednesday", "2024-01-10"),
        ("Last Wednesday.", "2024-01-10"),
    ],
)
def test_weekdays_from_wednesday(text: str, expected: str) -> None:
    assert r(text, WED) == (expected, "day")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("last Sunday", "2024-01-14"),
        ("last Saturday", "2024-01-20"),
        ("last Monday", "2024-01-15"),
        ("on Sunday", "2024-01-14"),
        ("this Saturday", "2024-01-20"),
        ("this Sunday", "2024-01-21"),
        ("this Monday", "2024-01-15"),
        ("next Monday", "2024-01-22"),
        ("next Saturday", "2024-01-27"),
        ("next Sunday", "2024-01-28"),
        ("this coming Monday", "2024-01-22"),
        ("this coming Sunday", "2024-01-28"),
    ],
)
def test_weekdays_from_sunday(text: str, expected: str) -> None:
    assert r(text, SUN) == (expected, "day")


@pytest.mark.parametrize(
    ("anchor", "text", "expected"),
    [
        (WED, "last weekend", "2024-01-13"),
        (WED, "this weekend", "2024-01-20"),
        (WED, "next weekend", "2024-01-27"),
        (WED, "this past weekend", "2024-01-13"),
        (WED, "this coming weekend", "2024-01-20"),
        (SUN, "last weekend", "2024-01-13"),
        (SUN, "this weekend", "2024-01-20"),
        (SUN, "this past weekend", "2024-01-20"),
        (SUN, "next weekend", "2024-01-27"),
    ],
)
def test_weekends_resolve_to_their_saturday(anchor: datetime, text: str, expected: str) -> None:
    assert r(text, anchor) == (expected, "week")


# --- last/this/next week|month|year --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "formatted"),
    [
        ("last week", ("2024-01-10", "week"), "2024-01-10"),
        ("this week", ("2024-01-17", "week"), "2024-01-17"),
        ("next week", ("2024-01-24", "week"), "2024-01-24"),
        ("last month", ("2023-12-17", "month"), "2023-12"),
        ("this month", ("2024-01-17", "month"), "2024-01"),
        ("next month", ("2024-02-17", "month"), "2024-02"),
        ("last year", ("2023-01-17", "year"), "2023"),
        ("this year", ("2024-01-17", "year"), "2024"),
        ("next year", ("2025-01-17", "year"), "2025"),
    ],
)
def test_periods(text: str, expected: tuple[str, str], formatted: str) -> None:
    assert r(text) == expected
    found = resolve(text, WED)
    assert found is not None and format_resolved(found) == formatted


def test_last_month_is_calendar_safe() -> None:
    assert r("last month", datetime(2024, 3, 31, tzinfo=UTC)) == ("2024-02-29", "month")
    assert r("last year", LEAP) == ("2023-02-28", "year")


# --- N units ago / in N units -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("three weeks ago", ("2023-12-27", "week")),
        ("3 weeks ago", ("2023-12-27", "week")),
        ("a week ago", ("2024-01-10", "week")),
        ("one day ago", ("2024-01-16", "day")),
        ("3 days ago", ("2024-01-14", "day")),
        ("twenty days ago", ("2023-12-28", "day")),
        ("seventeen days ago", ("2023-12-31", "day")),
        ("seven days ago", ("2024-01-10", "day")),
        ("a couple of days ago", ("2024-01-15", "day")),
        ("a couple days ago", ("2024-01-15", "day")),
        ("two months ago", ("2023-11-17", "month")),
        ("a month ago", ("2023-12-17", "month")),
        ("a year ago", ("2023-01-17", "year")),
        ("two years ago", ("2022-01-17", "year")),
        ("ten years ago", ("2014-01-17", "year")),
        ("an hour ago", ("2024-01-17", "day")),
        ("about three weeks ago", ("2023-12-27", "week")),
        ("in 3 days", ("2024-01-20", "day")),
        ("in two weeks", ("2024-01-31", "week")),
        ("in a month", ("2024-02-17", "month")),
        ("in one year", ("2025-01-17", "year")),
        ("two days from now", ("2024-01-19", "day")),
    ],
)
def test_counted_offsets(text: str, expected: tuple[str, str]) -> None:
    assert r(text) == expected


@pytest.mark.parametrize("text", ["two days", "3 weeks", "a year"])
def test_bare_duration_is_not_a_date(text: str) -> None:
    assert resolve(text, WED) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("two years ago", ("2022-02-28", "year")),
        ("a year ago", ("2023-02-28", "year")),
        ("in one year", ("2025-02-28", "year")),
        ("four years ago", ("2020-02-29", "year")),
        ("a month ago", ("2024-01-29", "month")),
        ("yesterday", ("2024-02-28", "day")),
        ("tomorrow", ("2024-03-01", "day")),
    ],
)
def test_offsets_near_leap_day(text: str, expected: tuple[str, str]) -> None:
    assert r(text, LEAP) == expected


# --- timezone: the anchor's own local date -----------------------------------------------------


def test_anchor_local_date_not_utc() -> None:
    assert r("today", NEW_YEAR_CET) == ("2024-01-01", "day")
    assert r("yesterday", NEW_YEAR_CET) == ("2023-12-31", "day")
    assert r("this year", NEW_YEAR_CET) == ("2024-01-01", "year")
    assert r("last year", NEW_YEAR_CET) == ("2023-01-01", "year")


def test_anchor_west_of_utc() -> None:
    ny = datetime(2024, 1, 17, 23, 30, tzinfo=ZoneInfo("America/New_York"))  # 2024-01-18 in UTC
    assert r("today", ny) == ("2024-01-17", "day")
    assert r("last Wednesday", ny) == ("2024-01-10", "day")


def test_hours_ago_can_cross_local_midnight() -> None:
    assert r("an hour ago", NEW_YEAR_CET) == ("2023-12-31", "day")
    assert r("two hours from now", datetime(2024, 1, 17, 23, 0, tzinfo=CET)) == ("2024-01-18", "day")


def test_absolute_month_without_year_uses_anchor_local_year() -> None:
    assert r("December", NEW_YEAR_CET) == ("2023-12-01", "month")
    assert r("January", NEW_YEAR_CET) == ("2024-01-01", "month")


# --- ResolvedDate / format_resolved ------------------------------------------------------------


@pytest.mark.parametrize(
    ("resolved", "text"),
    [
        (ResolvedDate(date(2024, 1, 17), "day"), "2024-01-17"),
        (ResolvedDate(date(2024, 1, 17), "week"), "2024-01-17"),
        (ResolvedDate(date(2024, 1, 17), "month"), "2024-01"),
        (ResolvedDate(date(2024, 1, 17), "year"), "2024"),
        (ResolvedDate(date(999, 3, 4), "year"), "0999"),
    ],
)
def test_format_resolved(resolved: ResolvedDate, text: str) -> None:
    assert format_resolved(resolved) == text


def test_resolved_date_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ResolvedDate(date(2024, 1, 17), "day").value = date(2024, 1, 18)  # type: ignore[misc]


# --- RELATIVE_PATTERN / absolutize ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I adopted a cat three weeks ago", "I adopted a cat three weeks ago (2023-12-27)"),
        ("Yesterday I ran.", "Yesterday (2024-01-16) I ran."),
        ("We met last Wednesday at noon.", "We met last Wednesday (2024-01-10) at noon."),
        ("I went hiking on Tuesday.", "I went hiking on Tuesday (2024-01-16)."),
        ("The party is next Saturday!", "The party is next Saturday (2024-01-27)!"),
        ("I moved last year, in May.", "I moved last year (2023), in May."),
        ("Busy this month", "Busy this month (2024-01)"),
        ("We married two years ago", "We married two years ago (2022)"),
        ("Back in 3 days", "Back in 3 days (2024-01-20)"),
        ("the day before yesterday and today", "the day before yesterday (2024-01-15) and today (2024-01-17)"),
        ("Last weekend was fun", "Last weekend (2024-01-13) was fun"),
        ("It was LAST\nWEEK", "It was LAST\nWEEK (2024-01-10)"),
    ],
)
def test_absolutize(text: str, expected: str) -> None:
    assert absolutize(text, WED) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Nothing relative here.",
        "On Wednesday, 17 January 2024 we met.",  # weekday followed by a date is already absolute
        "on Wednesday 17 January",
        "I go swimming on Wednesdays.",  # habitual, not one day
        "twenty-one days ago",  # must not be read as "one day ago"
        "Yesterday's news",
        "the lastweek typo",
        "Today (2024-01-17) I ran.",
    ],
)
def test_absolutize_leaves_text_alone(text: str) -> None:
    assert absolutize(text, WED) == text


def test_absolutize_is_idempotent() -> None:
    text = "Three weeks ago I adopted a cat; last month and this year, yesterday, next Saturday, in 2 days."
    once = absolutize(text, WED)
    assert once != text
    assert absolutize(once, WED) == once
    assert absolutize(once, SUN) == once  # already dated: another anchor changes nothing


def test_absolutize_keeps_an_existing_parenthesised_date() -> None:
    assert absolutize("last month (2023-12) and last year (2023)", WED) == "last month (2023-12) and last year (2023)"


def test_relative_pattern_finds_expressions() -> None:
    found = [m.group(0) for m in RELATIVE_PATTERN.finditer("Yesterday, two years ago and NEXT Friday; on Monday too")]
    assert found == ["Yesterday", "two years ago", "NEXT Friday", "on Monday"]


# --- leading_date --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "rest"),
    [
        ("2024-01-17: I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("2024-01-17 - I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("2024-01-17 I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("2024-01-17T10:00:00Z: I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("[2024-01-17] I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("(2024-01-17) I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("On 17 January 2024, I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("on 17th January 2024 I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("January 17, 2024 - I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("On January 17th, 2024, I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("On Wednesday, 17 January 2024, I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("17 Jan 2024 — I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("  2024-01-17:   I adopted a cat.", date(2024, 1, 17), "I adopted a cat."),
        ("2024-01: Busy month.", date(2024, 1, 1), "Busy month."),
        ("2024: Busy year.", date(2024, 1, 1), "Busy year."),
        ("May 2023: Busy month.", date(2023, 5, 1), "Busy month."),
    ],
)
def test_leading_date(text: str, expected: date, rest: str) -> None:
    assert leading_date(text) == (expected, rest)


@pytest.mark.parametrize(
    "text",
    [
        "I adopted a cat on 2024-01-17.",
        "2024 was a good year.",
        "May 2023 was a good month.",  # a bare year only counts as a stamp with a colon
        "On Wednesday, I adopted a cat.",
        "2024-02-30: not a date.",
        "20240117: compact",
        "",
    ],
)
def test_no_leading_date(text: str) -> None:
    assert leading_date(text) == (None, text)


# --- gist_sentence -----------------------------------------------------------------------------


DAY = ResolvedDate(date(2024, 1, 17), "day")


@pytest.mark.parametrize(
    ("text", "when", "expected"),
    [
        ("I adopted a cat", DAY, "2024-01-17: I adopted a cat."),
        (
            "Caroline adopted a cat three weeks ago",
            DAY,
            "2024-01-17: Caroline adopted a cat three weeks ago (2023-12-27).",
        ),
        ("2024-01-16: Caroline   went\nhiking.", DAY, "2024-01-17: Caroline went hiking."),  # model date replaced
        ("On 17 January 2024, caroline ran", DAY, "2024-01-17: caroline ran."),  # first letter kept as is
        ("[2024-01-17] 2024-01-17: Did she?", DAY, "2024-01-17: Did she?"),
        ('She said "hi!"', DAY, '2024-01-17: She said "hi!"'),
        ("Ran a marathon (her first).", DAY, "2024-01-17: Ran a marathon (her first)."),
        ("Ran a marathon (her first)", DAY, "2024-01-17: Ran a marathon (her first)."),
        (
            "Moved to Berlin last year",
            ResolvedDate(date(2023, 1, 1), "year"),
            "2023: Moved to Berlin last year (2023).",
        ),
        ("May 2023: Started a job", ResolvedDate(date(2023, 5, 1), "month"), "2023-05: Started a job."),
        ("2023-05: Started a job", ResolvedDate(date(2023, 5, 1), "month"), "2023-05: Started a job."),
    ],
)
def test_gist_sentence(text: str, when: ResolvedDate, expected: str) -> None:
    assert gist_sentence(text, when, WED) == expected


def test_gist_sentence_absolutizes_against_the_anchor_not_the_gist_date() -> None:
    when = ResolvedDate(date(2023, 12, 27), "week")
    assert gist_sentence("Adopted a cat three weeks ago", when, WED) == (
        "2023-12-27: Adopted a cat three weeks ago (2023-12-27)."
    )
    assert gist_sentence("Went out yesterday", DAY, NEW_YEAR_CET) == "2024-01-17: Went out yesterday (2023-12-31)."


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("2024-01-16: went hiking last Wednesday", DAY),
        ("Moved away two years ago", ResolvedDate(date(2022, 1, 17), "year")),
        ("Started this month", ResolvedDate(date(2024, 1, 1), "month")),
    ],
)
def test_gist_sentence_is_idempotent(text: str, when: ResolvedDate) -> None:
    once = gist_sentence(text, when, WED)
    assert gist_sentence(once, when, WED) == once


@pytest.mark.parametrize("text", ["", "   ", "2024-01-17:", "[2024-01-17]  -  "])
def test_gist_sentence_rejects_empty_text(text: str) -> None:
    with pytest.raises(ValueError):
        gist_sentence(text, DAY, WED)


# --- the edges of the calendar: date arithmetic past year 1 or 9999 is no date, never an exception ---
LAST_DAY = datetime(9999, 12, 31, 0, 0, tzinfo=UTC)
FIRST_DAY = datetime(1, 1, 1, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "anchor"), [
    ("next year", LAST_DAY), ("tomorrow", LAST_DAY), ("next week", LAST_DAY), ("in 3 days", LAST_DAY),
    ("next Monday", LAST_DAY), ("in 2 hours", datetime(9999, 12, 31, 23, 0, tzinfo=UTC)), ("this coming weekend", LAST_DAY),
    ("last year", FIRST_DAY), ("yesterday", FIRST_DAY), ("last week", FIRST_DAY), ("3 months ago", FIRST_DAY),
    ("last Sunday", FIRST_DAY), ("999 years ago", FIRST_DAY), ("in 999 years", datetime(9500, 1, 1, tzinfo=UTC)),
])
def test_dates_beyond_the_calendar_resolve_to_nothing(text, anchor):
    assert resolve(text, anchor) is None
    assert absolutize(f"We met {text}.", anchor) == f"We met {text}."


def test_dates_at_the_edges_of_the_calendar_still_resolve():
    assert r("this year", LAST_DAY) == ("9999-12-31", "year")
    assert r("yesterday", LAST_DAY) == ("9999-12-30", "day")
    assert r("tomorrow", FIRST_DAY) == ("0001-01-02", "day")


@pytest.mark.parametrize(("text", "expected"), [
    # A sentence about what is coming: "on Friday" is the coming Friday, not the last one.
    ("My sister's wedding is this Saturday, so I fly back to Bristol on Friday.",
     [("this Saturday", date(2024, 1, 20)), ("on Friday", date(2024, 1, 19))]),
    ("I will see her tomorrow and we meet again on Monday.",
     [("tomorrow", date(2024, 1, 18)), ("on Monday", date(2024, 1, 22))]),
    # Said in the past tense, or with nothing about the future: the documented rule (the last one).
    ("I saw her on Friday, and tomorrow I am free.", [("on Friday", date(2024, 1, 12)), ("tomorrow", date(2024, 1, 18))]),
    ("We went hiking on Sunday.", [("on Sunday", date(2024, 1, 14))]),
    ("The parcel arrived on Friday. It is raining tomorrow.", [("on Friday", date(2024, 1, 12)), ("tomorrow", date(2024, 1, 18))]),
])
def test_a_weekday_in_a_sentence_about_the_future_is_the_coming_one(text: str, expected: list) -> None:
    assert [(e, d.value) for e, d in relative_dates(text, WED)] == expected
    annotated = absolutize(text, WED)  # the same resolution wherever a date is written out
    assert all(f"{e} ({d.isoformat()})" in annotated for e, d in expected)
