"""What every contract shares: the frozen base model, its schema version, and the field types that
keep a value storable (identifiers, text, instants, metadata, topic names)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    StringConstraints,
)

SCHEMA_VERSION = 1

#: The UTC instants a turn may carry: PostgreSQL stores a wider range than Python's datetime
#: (years 1-9999) reads back, and a stored instant is read back in a UTC offset of up to a day,
#: so a day inside Python's range at each end keeps every stored time readable.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)

#: How deep a turn's metadata may nest (PostgreSQL's jsonb and every reader stay far from a limit).
METADATA_MAX_DEPTH = 32


def storable_text(text: str) -> str:
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
        storable_text(value)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError("holds a number that is not finite (NaN or Infinity)")
    elif isinstance(value, dict):
        for key, item in value.items():
            storable_text(key)
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
    str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True), AfterValidator(storable_text)
]


Text = Annotated[str, StringConstraints(min_length=1, max_length=20_000), AfterValidator(storable_text)]


Speaker = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(storable_text)]


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


# What Kafka accepts as a topic name (its Topic.validate): ASCII letters, digits, '.', '_', '-', at most
# 249 characters, and not '.' or '..'. A reply topic outside this is an invalid question, dead-lettered.
def _not_dots(name: str) -> str:
    if name in (".", ".."):
        raise ValueError("'.' and '..' are not topic names")
    return name


TopicName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$"), AfterValidator(_not_dots)]


#: The header that marks a record that is not its topic's own contract: a progress record on a reply topic,
#: a withdrawal on the questions topic (a reply, a question carry none).
RECORD_HEADER = "epistream-record"


def marked(headers: Iterable[tuple[str, bytes | None]] | None, kind: bytes) -> bool:
    """Whether a record's headers mark it as a record of `kind` (RECORD_HEADER)."""
    return any(name == RECORD_HEADER and value == kind for name, value in headers or ())
