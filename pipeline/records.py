"""A consumed Kafka record, independent of the client library that read it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None

    @property
    def produced_at(self) -> datetime | None:
        if self.timestamp_ms is None or self.timestamp_ms <= 0:
            return None
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)
