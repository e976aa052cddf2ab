"""A consumed Kafka record, independent of the client library that read it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from epistream.core.claims import header_pairs


@dataclass(frozen=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def from_faust(cls, event: Any) -> RawRecord:
        """The record behind a Faust event (its message as consumed)."""
        message = event.message
        return cls(topic=message.topic, partition=message.partition, offset=message.offset, key=message.key,
                   value=message.value,
                   timestamp_ms=int(message.timestamp * 1000) if message.timestamp else None,
                   headers=header_pairs(message.headers))

    @property
    def produced_at(self) -> datetime | None:
        if self.timestamp_ms is None or self.timestamp_ms <= 0:
            return None
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)
