"""The tools' arguments as data: pydantic models (extra fields forbidden, bounded
limits), and their date expressions resolved into an inclusive range of days.

A date expression ("May 2023", "last year", "2024-03-18") is resolved against
the time the question was asked (epistream.pipeline.dates), and stands for its whole
period: the same period as epistream.consumers.timefilter.DateRange, read here as
inclusive first and last days.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from epistream.core.dates import ResolvedDate, resolve
from epistream.core.names import normalize_name, normalize_predicate
from epistream.errors import PermanentError

from ..timefilter import DateRange
from .limits import MAX_LIMIT, MAX_OFFSET, MAX_WINDOW, Aggregate, Operator, Order, Target


class ToolArgumentError(PermanentError, ValueError):
    """A model proposed a tool that does not exist, or arguments that do not validate."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"{tool}: {message}")
        self.tool = tool


DateText = Annotated[str, Field(min_length=1, max_length=100)]
_START = ("Inclusive lower bound: a date or expression resolved against the question time "
          "('2023-05-14', 'May 2023', '2023', 'last year'); a month or year starts at its first day.")
_END = "Inclusive upper bound, like start; a month or year ends at its last day ('May 2023' -> 2023-05-31)."
_DURING = "Shorthand for start and end both set to one period ('May 2023', 'last year', '2024-03-18')."


# No docstrings on the models below: pydantic would put them in the tools' JSON schemas.
class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class TimeArgs(ToolArgs):
    start: DateText | None = Field(None, description=_START)
    end: DateText | None = Field(None, description=_END)
    during: DateText | None = Field(None, description=_DURING)


class SemanticRetrieveArgs(TimeArgs):
    query: str = Field(min_length=1, max_length=1000, description="What to look for, in words.")
    target: Target = Field("gists", description="'gists' (dated one-sentence events) or 'turns' (raw dialogue).")
    limit: int = Field(10, ge=1, le=MAX_LIMIT, description="How many results.")


class LexicalRetrieveArgs(SemanticRetrieveArgs):
    operator: Operator = Field(
        "or", description="'or': any of the words; 'and': all of them; 'phrase': the words in sequence.")


class FindGistContextsArgs(ToolArgs):
    gist_id: str = Field(min_length=1, max_length=300, description="A gist_id from a retrieval result.")
    window: int = Field(2, ge=0, le=MAX_WINDOW, description="Neighbouring gists in time on each side.")


class FindEntityContextsArgs(TimeArgs):
    subject: str | None = Field(None, min_length=1, max_length=200, description="Subject entity name.")
    predicate: str | None = Field(
        None, min_length=1, max_length=100, description="Relation, e.g. 'lives_in', 'visited'; a prefix matches too.")
    object: str | None = Field(None, min_length=1, max_length=200, description="Object entity name.")
    order: Order = Field("asc", description="By the fact's time: 'asc' oldest first, 'desc' newest first.")
    limit: int = Field(10, ge=1, le=MAX_LIMIT, description="Facts per page.")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="Facts to skip (offset 1 with order asc: the second).")
    aggregate: Aggregate = Field(
        "none", description="'count': how many facts match; 'first'/'last': the earliest/latest one.")
    current_only: bool = Field(
        False, description="Only facts still current (the latest object per subject and predicate).")

    @field_validator("subject", "object")
    @classmethod
    def _name_has_words(cls, value: str | None) -> str | None:
        if value is not None and not normalize_name(value):
            raise ValueError("a name needs letters or digits")
        return value

    @field_validator("predicate")
    @classmethod
    def _predicate_has_words(cls, value: str | None) -> str | None:
        if value is not None and not normalize_predicate(value):
            raise ValueError("a predicate needs letters or digits")
        return value


class ReadSegmentArgs(ToolArgs):
    segment_id: str = Field(min_length=1, max_length=300, description="A segment_id from a retrieval result.")


class OutputAnswerArgs(ToolArgs):
    answer: str = Field(max_length=4000, description="The final answer, short.")
    abstain: bool = Field(False, description="True when the memory holds no evidence for an answer.")
    evidence: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        default_factory=list, max_length=MAX_LIMIT,
        description="Ids that support the answer (gist_id, fact_id, turn_id or segment_id).")

    @model_validator(mode="after")
    def _answer_or_abstain(self) -> OutputAnswerArgs:
        if not self.abstain and not self.answer:
            raise ValueError("give an answer, or abstain")
        return self


# --------------------------------------------------------------------------- dates
def period(resolved: ResolvedDate) -> tuple[date, date] | None:
    """The first and last day a resolved date stands for, at its precision (DateRange's, end inclusive);
    None past the calendar's end (DateRange.of's guard)."""
    span = DateRange.of(resolved)  # [start, end) in UTC midnights
    return None if span is None else (span.start.date(), (span.end - timedelta(days=1)).date())


def _period_of(tool: str, field: str, text: str, asked_at: datetime) -> tuple[date, date]:
    resolved = resolve(text, asked_at)
    if resolved is None:
        raise ToolArgumentError(tool, f"{field}: cannot read {text!r} as a date (try '2024-05-14', 'May 2024', "
                                      "'2024' or 'last year')")
    span = period(resolved)
    if span is None:
        raise ToolArgumentError(tool, f"{field}: {text!r} runs past the end of the calendar")
    return span


def resolve_range(tool: str, args: TimeArgs, asked_at: datetime) -> tuple[date | None, date | None]:
    """[start, end] from the arguments: start opens its period, end closes its own; during sets both.

    With ``during`` and start/end together, the range is their intersection.
    """
    lows: list[date] = []
    highs: list[date] = []
    if args.start is not None:
        lows.append(_period_of(tool, "start", args.start, asked_at)[0])
    if args.end is not None:
        highs.append(_period_of(tool, "end", args.end, asked_at)[1])
    if args.during is not None:
        low, high = _period_of(tool, "during", args.during, asked_at)
        lows.append(low)
        highs.append(high)
    start = max(lows) if lows else None
    end = min(highs) if highs else None
    if start is not None and end is not None and start > end:
        raise ToolArgumentError(tool, f"empty time range: {start.isoformat()} is after {end.isoformat()}")
    return start, end
