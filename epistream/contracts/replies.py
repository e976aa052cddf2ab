"""`memory.answers`: an answer with its evidence, or a `context` read's ranked memory; and, for a
question that asked for them, the progress records that go before its reply."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
)

from .base import Contract, marked
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


class ProgressStep(StrEnum):
    """A step of answering, as a `Progress` record names it."""

    #: answering began, in `mode` (`auto` names its choice)
    MODE = "mode"
    #: memory found: `total` passages for the assistants (deep) or items for the master (fast)
    RETRIEVED = "retrieved"
    #: an assistant read a passage: `done` of `total` (deep), or one segment a tool asked for (agentic)
    ASSISTANT_READ = "assistant_read"
    #: agentic: the master chose `tool`, step `done` of at most `total`
    TOOL_CALL = "tool_call"
    #: the master model is called for the answer
    MASTER_CALL = "master_call"


#: The value of RECORD_HEADER that marks a progress record on a reply topic (a reply has none).
PROGRESS_RECORD = b"progress"
#: Ends a progress record's key: no question id holds a NUL, so no reply's key is ever a progress key.
PROGRESS_KEY_SUFFIX = b"\x00progress"


def progress_key(question_id: str) -> bytes:
    """The key of a question's progress records: never a reply's key (a reader matching replies by
    question id never takes one for its reply)."""
    return question_id.encode() + PROGRESS_KEY_SUFFIX


def is_progress(headers: Iterable[tuple[str, bytes | None]] | None) -> bool:
    """Whether a reply topic's record is a progress record, from its headers alone."""
    return marked(headers, PROGRESS_RECORD)


class Progress(Contract):
    """A step of answering a question that asked for progress (`Question.progress`), on its reply topic
    and partition before the reply, keyed `progress_key(question_id)` and marked by `RECORD_HEADER`.
    Informational: sent at most once, outside the reply's transaction, and possibly lost; never a reply.
    It names steps and counts, never the tenant's text."""

    kind: Literal["progress"] = "progress"
    question_id: str
    #: 1, 2, ... in the order the worker took the steps (a question answered again after a crash starts again at 1)
    seq: Annotated[int, Field(ge=1)]
    step: ProgressStep
    mode: Mode
    done: Annotated[int, Field(ge=0)] | None = None
    total: Annotated[int, Field(ge=0)] | None = None
    #: the agentic tool chosen (a name of the worker's own tool registry)
    tool: Annotated[str, StringConstraints(pattern=r"^[a-z_]{1,64}$")] | None = None

    def describe(self) -> str:
        """The step in a few words for a person watching (names and counts only)."""
        of = f"{self.done}/{self.total}" if self.done is not None and self.total is not None else (
            f"{self.done}" if self.done is not None else "")
        return {
            ProgressStep.MODE: f"answering in {self.mode.value} mode",
            ProgressStep.RETRIEVED: f"{self.mode.value}: {self.total or 0} item(s) of memory found",
            ProgressStep.ASSISTANT_READ: f"{self.mode.value}: assistant read {of}".rstrip(),
            ProgressStep.TOOL_CALL: f"{self.mode.value}: step {of}: {self.tool or 'a tool'}",
            ProgressStep.MASTER_CALL: f"{self.mode.value}: the master model answers",
        }[self.step]
