"""Typed message contracts, one frozen model per topic value.

Every value is JSON (UTF-8). Unknown fields are rejected so a producer's typo
is dead-lettered instead of silently dropped.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Self, TypeVar, get_args, overload

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from .errors import ContractError

SCHEMA_VERSION = 1

#: The UTC instants a turn may carry: PostgreSQL stores a wider range than Python's datetime
#: (years 1-9999) reads back, and a stored instant is read back in a UTC offset of up to a day,
#: so a day inside Python's range at each end keeps every stored time readable.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)
#: How deep a turn's metadata may nest (PostgreSQL's jsonb and every reader stay far from a limit).
METADATA_MAX_DEPTH = 32


def _storable(text: str) -> str:
    # PostgreSQL text cannot hold NUL, and a lone surrogate has no UTF-8 form: reject both here,
    # with a reason, instead of letting the database refuse the whole batch.
    if "\x00" in text:
        raise ValueError("contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not encodable as UTF-8 ({exc.reason} at {exc.start})") from None
    return text



def _storable_json(value: Any, depth: int = 0) -> None:
    if depth > METADATA_MAX_DEPTH:
        raise ValueError(f"nested more than {METADATA_MAX_DEPTH} levels deep")
    if isinstance(value, str):
        _storable(value)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError("holds a number that is not finite (NaN or Infinity)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _storable(key)
            _storable_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _storable_json(item, depth + 1)


def _storable_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    _storable_json(metadata)
    return metadata


def _round_trips(ts: datetime) -> datetime:
    try:
        instant = ts.astimezone(UTC)
    except OverflowError:
        instant = None
    if instant is None or not EARLIEST <= instant <= LATEST:
        raise ValueError(f"instant outside {EARLIEST:%Y-%m-%d} .. {LATEST:%Y-%m-%d} UTC (what can be stored and read back)")
    return ts


Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True), AfterValidator(_storable)
]
Text = Annotated[str, StringConstraints(min_length=1, max_length=20_000), AfterValidator(_storable)]
Speaker = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_storable)]
Instant = Annotated[AwareDatetime, AfterValidator(_round_trips)]
Metadata = Annotated[dict[str, Any], AfterValidator(_storable_metadata)]


class Contract(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> Self:
        if raw is None:
            raise ValueError("empty message value")
        return cls.model_validate_json(raw)


class Turn(Contract):
    """`memory.turns`, keyed by conversation id."""

    tenant: Identifier
    conversation_id: Identifier
    turn_id: Identifier
    speaker: Speaker
    text: Text
    ts: Instant
    session_id: Identifier | None = None
    metadata: Metadata = Field(default_factory=dict)


class SegmentCloseRequest(Contract):
    """A control record on `memory.turns`: close the open segment if it still ends
    at `after_turn_id`. The ingest worker emits it when a conversation goes idle;
    keeping the decision in Kafka makes a replay cut the segments the same way."""

    kind: Literal["segment_close"]
    tenant: Identifier
    conversation_id: Identifier
    after_turn_id: Identifier
    reason: Literal["idle"] = "idle"


class ForgetRecord(Contract):
    """`memory.forgotten` (compacted), keyed by `key()`: a conversation, or with no conversation id the
    whole tenant, was forgotten. Every worker reads the topic before `memory.turns`, so a rebuild of
    the memory from Kafka into an empty database skips what was forgotten."""

    kind: Literal["forgotten"] = "forgotten"
    tenant: Identifier
    conversation_id: Identifier | None = None
    forgotten_at: Instant

    def key(self) -> bytes:
        # One record per scope survives compaction; the length prefix keeps ("ab", "c") from ("a", "bc").
        return f"{len(self.tenant)}:{self.tenant}:{self.conversation_id or ''}".encode()


class SegmentTurn(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    turn_id: str
    speaker: str
    text: str
    ts: AwareDatetime


class Segment(Contract):
    """`memory.segments`, keyed by conversation id: a closed segment, whole."""

    tenant: str
    conversation_id: str
    segment_id: str
    seq: int
    close_reason: Literal["budget", "session", "gap", "idle"]
    overlap_turns: int
    token_estimate: int
    turns: list[SegmentTurn]
    produced_at: AwareDatetime | None = None


# What Kafka accepts as a topic name (its Topic.validate): ASCII letters, digits, '.', '_', '-', at most
# 249 characters, and not '.' or '..'. A reply topic outside this is an invalid question, dead-lettered.
def _not_dots(name: str) -> str:
    if name in (".", ".."):
        raise ValueError("'.' and '..' are not topic names")
    return name


TopicName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$"), AfterValidator(_not_dots)]


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
#: The modes that read memory through the budgeted context builder (budget and time range apply).
CONTEXT_MODES = frozenset({"context", "fast"})


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


class Position(BaseModel):
    """A conversation's last produced turn on `memory.turns` (docs/read-your-writes.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    conversation_id: Identifier
    partition: Annotated[int, Field(ge=0)]
    offset: Annotated[int, Field(ge=0)]


class Question(Contract):
    """`memory.questions`, keyed by question id."""

    question_id: Identifier
    tenant: Identifier
    question: Annotated[str, StringConstraints(min_length=1, max_length=4_000), AfterValidator(_storable)]
    conversation_ids: list[Identifier] | None = None
    asked_at: AwareDatetime | None = None
    mode: Mode = Mode.AUTO
    reply_topic: TopicName | None = None
    #: context and fast modes: most tokens of memory (context: CONTEXT_BUDGET_DEFAULT if unset)
    budget_tokens: Budget | None = None
    #: context and fast modes: read only memory of this period
    time_range: TimeRange | None = None
    #: any mode: read once ingest has stored memory.turns through these (bounded wait; see `incomplete`)
    after: Annotated[list[Position], Field(max_length=1_000)] | None = None
    listing: Literal["timeline", "facts"] | None = None  # context, one conversation: consumers/listing.py

    @model_validator(mode="after")
    def _budget_only_where_read(self) -> Question:
        # A filter a mode would silently ignore is refused instead (dead-lettered, with this reason).
        if self.mode.value not in CONTEXT_MODES and (self.budget_tokens is not None or self.time_range is not None):
            raise ValueError(f"budget_tokens and time_range apply to the {' and '.join(sorted(CONTEXT_MODES))} modes "
                             f"only, not {self.mode.value}")
        return self


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


class DeadLetter(Contract):
    """`memory.dlq`: the original bytes (base64) and why they could not be used.

    A letter always fits in one Kafka message: bytes that would not are cut to a prefix
    (``value_truncated``/``key_truncated``), and the size and SHA-256 of the whole
    original travel with it, so the record can still be recognised and counted."""

    topic: str
    partition: int
    offset: int
    key_b64: str | None
    value_b64: str | None
    stage: str
    error_class: str
    error_message: str
    attempts: int = 1
    failed_at: AwareDatetime
    value_size: int | None = None
    value_sha256: str | None = None
    value_truncated: bool = False
    key_size: int | None = None
    key_sha256: str | None = None
    key_truncated: bool = False

    @staticmethod
    def encode(raw: bytes | None) -> str | None:
        return None if raw is None else base64.b64encode(raw).decode()

    def original_value(self) -> bytes | None:
        return None if self.value_b64 is None else base64.b64decode(self.value_b64)

    def original_key(self) -> bytes | None:
        return None if self.key_b64 is None else base64.b64decode(self.key_b64)


C = TypeVar("C", bound=Contract)
D = TypeVar("D", bound=Contract)


@overload
def decode(raw: bytes | None, model: type[C], *, what: str) -> C: ...
@overload
def decode(raw: bytes | None, model: tuple[type[C], type[D]], *, what: str) -> C | D: ...
@overload
def decode(raw: bytes | None, model: Sequence[type[Contract]], *, what: str) -> Contract: ...
def decode(raw: bytes | None, model: type[Contract] | Sequence[type[Contract]], *, what: str) -> Contract:
    """A topic value as its contract, or a ContractError that says why not: where the JSON
    breaks, or which fields fail and how. ``what`` names the event in the reason
    ("memory.turns event"). Given several contracts, the value's ``kind`` picks the one whose
    ``kind`` literal names it; any other value is read as the one without a ``kind`` field."""
    try:
        if raw is None:
            raise ValueError("empty message value")
        # UTF-8 only (json.loads would guess UTF-16 or -32 from the bytes); a UTF-8 BOM is tolerated.
        data = json.loads(raw.decode("utf-8").removeprefix("\ufeff"))
        chosen = model if isinstance(model, type) else _by_kind(model, data)
        return chosen.model_validate(data)
    except (ValidationError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ContractError(f"not a valid {what}: {_reason(exc)}") from exc
    except RecursionError as exc:  # the parser's own limit, long before any contract looks at the value
        raise ContractError(f"not a valid {what}: JSON nested too deeply to read") from exc


def validated(model: type[C], *, what: str, **fields: Any) -> C:
    """A contract built from fields, or a ContractError that says which fail and how (as decode does)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise ContractError(f"not a valid {what}: {_reason(exc)}") from exc


def _kinds(model: type[Contract]) -> tuple[Any, ...]:
    field = model.model_fields.get("kind")
    return () if field is None else get_args(field.annotation)


def _by_kind(models: Sequence[type[C]], data: Any) -> type[C]:
    kind = data.get("kind") if isinstance(data, dict) else None
    tagged = [m for m in models if kind is not None and kind in _kinds(m)]
    return tagged[0] if tagged else next(m for m in models if not _kinds(m))


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()[:5])
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    return str(exc)[:500]
