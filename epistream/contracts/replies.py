"""`memory.answers`: an answer with its evidence, or a `context` read's ranked memory."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from .base import Contract
from .questions import Mode, TimeRange


class Evidence(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    conversation_id: str
    segment_id: str | None = None
    turn_ids: list[str]
    quote: str
    time: datetime
    speaker: str | None = None


class RoleTokens(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: int = 0
    completion: int = 0
    calls: int = 0


class Answer(Contract):
    """`memory.answers`, keyed by question id."""

    question_id: str
    tenant: str
    answer: str
    abstained: bool
    evidence: list[Evidence]
    mode: Mode
    latency_ms: float
    tokens: dict[str, RoleTokens]
    error: str | None = None
    #: why the answer may miss turns the question's `after` named (not stored in time); None: it did not
    incomplete: str | None = None


class ResolvedPeriod(BaseModel):
    """A date expression ("last week", "yesterday", "May 2023") as the calendar days it stands for,
    [start, end] inclusive, resolved against when it was said (a turn) or asked (a question)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    expression: str
    start: date
    end: date
    precision: Literal["day", "week", "month", "year"]
    #: the question's period the read ranks by: memory about it comes first (only ``time_range`` filters)
    filters: bool = False


class MemoryItem(BaseModel):
    """One ranked item of a context read: a turn (verbatim), a gist or a fact, with its ids, its
    times, the pathway scores that ranked it, and its line exactly as the text block shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["turn", "gist", "fact"]
    rank: int  # 1 = best; the number its line carries ("[rank] ..."; the text block is in time order)
    conversation_id: str
    segment_id: str | None = None
    turn_id: str | None = None
    gist_id: str | None = None
    fact_id: str | None = None
    turn_ids: list[str]  # the turns it comes from (a turn: itself)
    speaker: str | None = None
    text: str  # a turn's own words; a gist's sentence; a fact's "subject predicate object"
    time: datetime  # when it was said (a turn: in the speaker's own UTC offset)
    event_date: date | None = None  # gist
    date_precision: Literal["day", "week", "month", "year"] | None = None  # gist
    point_in_time: date | None = None  # fact
    start_time: date | None = None  # fact
    end_time: date | None = None  # fact
    current: bool | None = None  # fact: False when a later fact superseded it
    dates: list[ResolvedPeriod] = Field(default_factory=list)  # relative dates in a turn, resolved
    scores: dict[str, float]
    line: str
    tokens: int  # estimate_tokens(line)


class ConversationEntry(BaseModel):
    """One conversation of a ``conversations`` listing: its id, how many turns it holds, when the last was said."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    conversation_id: str
    turns: int
    last_turn_at: datetime


class MemoryContext(Contract):
    """The reply to a `context` question (on its reply topic, keyed by question id, beside answers:
    ``kind`` tells the two apart). ``text`` is the items' lines in time order, under a header per
    day ("# 2023-05-08 Monday", with the conversation when there are several; consumers/packing.py):
    sum(item.tokens) + the headers' tokens + one token per newline = ``used_tokens`` <= ``budget_tokens``."""

    kind: Literal["context"] = "context"
    question_id: str
    tenant: str
    asked_at: datetime
    items: list[MemoryItem]
    text: str
    budget_tokens: int
    used_tokens: int
    time_range: TimeRange | None = None  # as asked (a hard filter); memory of the question's own period ranks first
    resolved: list[ResolvedPeriod] = Field(default_factory=list)  # the question's date expressions
    past: bool = False  # the question asks about the past: superseded facts are included
    latency_ms: float
    error: str | None = None
    #: why the read may miss turns the question's `after` named (not stored in time); None: it did not
    incomplete: str | None = None
    #: the ``conversations`` listing: a page of the tenant's conversations in id order (``items`` is empty)
    conversations: list[ConversationEntry] | None = None
    #: that listing: whether another page follows (ask again with the last id as the page's ``after``)
    more: bool | None = None
    #: that listing asked with ``count``: how many conversations start with the prefix; None: more than it counts
    total: int | None = None
