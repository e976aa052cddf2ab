"""`memory.questions`: a question, its mode, its token budget and time range."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from .base import Contract, Identifier, Instant, TopicName, marked, storable_text
from .positions import Position


class Mode(StrEnum):
    FAST = "fast"
    DEEP = "deep"
    AGENTIC = "agentic"
    AUTO = "auto"
    #: no model call: the best memory within a token budget, for the asker's own model (MemoryContext)
    CONTEXT = "context"


#: A context read's token budget when the question names none, and the range it may name.
CONTEXT_BUDGET_DEFAULT = 1_000
CONTEXT_BUDGET_MIN = 50
CONTEXT_BUDGET_MAX = 32_000

#: The highest partition number a question may name for its reply (Kafka topics rarely hold more).
REPLY_PARTITION_MAX = 9_999

#: The modes that read memory through the budgeted context builder (budget and time range apply).
CONTEXT_MODES = frozenset({"context", "fast"})

#: What a `context` question with ``listing`` lists: one conversation's gists in time order (timeline) or
#: current facts, or the tenant's conversations (a page of them, in id order).
Listing = Literal["timeline", "facts", "conversations"]
#: The most conversations one page of the conversations listing holds.
CONVERSATIONS_PAGE_MAX = 100


def check_budget(tokens: int) -> int:
    """A token budget in the range a context read accepts (a ValueError says the range)."""
    if not CONTEXT_BUDGET_MIN <= tokens <= CONTEXT_BUDGET_MAX:
        raise ValueError(f"a token budget is {CONTEXT_BUDGET_MIN} to {CONTEXT_BUDGET_MAX} tokens, not {tokens}")
    return tokens


Budget = Annotated[int, AfterValidator(check_budget)]


class TimeRange(BaseModel):
    """Instants [start, end): either end may be open (None)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start: Instant | None = None
    end: Instant | None = None

    @model_validator(mode="after")
    def _ordered(self) -> TimeRange:
        if self.start is not None and self.end is not None and self.start >= self.end:
            raise ValueError(f"time_range starts ({self.start.isoformat()}) at or after it ends ({self.end.isoformat()})")
        return self


class ConversationPage(BaseModel):
    """Which page of the tenant's conversations a ``conversations`` listing reads: the ids that start with
    ``prefix``, in id order, after ``after`` (the last id of the page before), at most ``limit`` of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefix: Annotated[str, StringConstraints(max_length=200), AfterValidator(storable_text)] = ""
    after: Identifier | None = None
    limit: Annotated[int, Field(ge=1, le=CONVERSATIONS_PAGE_MAX)] = CONVERSATIONS_PAGE_MAX
    #: also count every id that starts with ``prefix`` (the reply's ``total``, up to a bound)
    count: bool = False


class Question(Contract):
    """`memory.questions`, keyed by question id."""

    question_id: Identifier
    tenant: Identifier
    question: Annotated[str, StringConstraints(min_length=1, max_length=4_000), AfterValidator(storable_text)]
    conversation_ids: list[Identifier] | None = None
    asked_at: AwareDatetime | None = None
    mode: Mode = Mode.AUTO
    reply_topic: TopicName | None = None
    #: the reply topic's partition the reply goes to (default: by the question id's hash); a long-lived
    #: client reads only its own partition (epistream/client/api.py)
    reply_partition: Annotated[int, Field(ge=0, le=REPLY_PARTITION_MAX)] | None = None
    #: context and fast modes: most tokens of memory (context: CONTEXT_BUDGET_DEFAULT if unset)
    budget_tokens: Budget | None = None
    #: context and fast modes: read only memory of this period
    time_range: TimeRange | None = None
    #: any mode: read once ingest has stored memory.turns through these (bounded wait; see `incomplete`)
    after: Annotated[list[Position], Field(max_length=1_000)] | None = None
    listing: Listing | None = None  # context only: consumers/listing.py
    page: ConversationPage | None = None  # the conversations listing only
    #: true: the answer worker sends `Progress` records of its steps before the reply (replies.py)
    progress: bool | None = None

    @model_validator(mode="after")
    def _page_only_where_listed(self) -> Question:
        if (self.page is not None) != (self.listing == "conversations"):
            raise ValueError("a page goes with the conversations listing, and that listing takes one")
        return self

    @model_validator(mode="after")
    def _budget_only_where_read(self) -> Question:
        # A filter a mode would silently ignore is refused instead (dead-lettered, with this reason).
        if self.mode.value not in CONTEXT_MODES and (self.budget_tokens is not None or self.time_range is not None):
            raise ValueError(f"budget_tokens and time_range apply to the {' and '.join(sorted(CONTEXT_MODES))} modes "
                             f"only, not {self.mode.value}")
        return self


#: The value of RECORD_HEADER (contracts.base) that marks a withdrawal on `memory.questions`.
WITHDRAWAL_RECORD = b"withdrawal"


def is_withdrawal(headers: Iterable[tuple[str, bytes | None]] | None) -> bool:
    """Whether a record of `memory.questions` is a withdrawal, from its headers alone."""
    return marked(headers, WITHDRAWAL_RECORD)


class Withdrawal(Contract):
    """`memory.questions`, keyed like the question it withdraws (its id, so it follows the question in
    its partition) and marked by RECORD_HEADER: the asker stopped waiting (its call was cancelled or
    timed out), so the answer worker stops answering it and replies that it was withdrawn. Honoured only
    for the question's own tenant (signed like a question where claims are checked)."""

    kind: Literal["withdrawal"] = "withdrawal"
    question_id: Identifier
    tenant: Identifier
