"""Typed message contracts, one frozen model per topic value.

Every value is JSON (UTF-8). Unknown fields are rejected so a producer's typo
is dead-lettered instead of silently dropped.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from .errors import ContractError

SCHEMA_VERSION = 1

Identifier = Annotated[str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True)]


def _no_nul(text: str) -> str:
    # PostgreSQL text cannot hold NUL; reject it here with a clear reason.
    if "\x00" in text:
        raise ValueError("text contains a NUL character")
    return text


Text = Annotated[str, StringConstraints(min_length=1, max_length=20_000), AfterValidator(_no_nul)]


class Contract(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | None):  # type: ignore[no-untyped-def]
        if raw is None:
            raise ValueError("empty message value")
        return cls.model_validate_json(raw)


class Turn(Contract):
    """`memory.turns`, keyed by conversation id."""

    tenant: Identifier
    conversation_id: Identifier
    turn_id: Identifier
    speaker: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    text: Text
    ts: AwareDatetime
    session_id: Identifier | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SegmentCloseRequest(Contract):
    """A control record on `memory.turns`: close the open segment if it still ends
    at `after_turn_id`. The ingest worker emits it when a conversation goes idle;
    keeping the decision in Kafka makes a replay cut the segments the same way."""

    kind: Literal["segment_close"]
    tenant: Identifier
    conversation_id: Identifier
    after_turn_id: Identifier
    reason: Literal["idle"] = "idle"


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


class Question(Contract):
    """`memory.questions`, keyed by question id."""

    question_id: Identifier
    tenant: Identifier
    question: Annotated[str, StringConstraints(min_length=1, max_length=4_000), AfterValidator(_no_nul)]
    conversation_ids: list[Identifier] | None = None
    asked_at: AwareDatetime | None = None
    mode: Mode = Mode.AUTO
    reply_topic: TopicName | None = None


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


class DeadLetter(Contract):
    """`memory.dlq`: the original bytes (base64) and why they could not be used."""

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

    @staticmethod
    def encode(raw: bytes | None) -> str | None:
        return None if raw is None else base64.b64encode(raw).decode()

    def original_value(self) -> bytes | None:
        return None if self.value_b64 is None else base64.b64decode(self.value_b64)

    def original_key(self) -> bytes | None:
        return None if self.key_b64 is None else base64.b64decode(self.key_b64)


C = TypeVar("C", bound=Contract)


def decode(raw: bytes | None, model: type[C] | Sequence[type[C]], *, what: str) -> C:
    """A topic value as its contract, or a ContractError that says why not: where the JSON
    breaks, or which fields fail and how. ``what`` names the event in the reason
    ("memory.turns event"). Given several contracts, the value's ``kind`` picks the one whose
    ``kind`` literal names it; any other value is read as the one without a ``kind`` field."""
    try:
        if raw is None:
            raise ValueError("empty message value")
        data = json.loads(raw)
        chosen = model if isinstance(model, type) else _by_kind(model, data)
        return chosen.model_validate(data)
    except (ValidationError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
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
