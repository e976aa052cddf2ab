"""`memory.dlq`: a record given up on, with where it came from and why."""

from __future__ import annotations

import base64

from pydantic import (
    AwareDatetime,
)

from .base import Contract


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
