"""What is produced to `memory.turns`: turns, and the control record that closes an idle segment;
and what `memory.forgotten` keeps of a forgotten conversation."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
)

from .base import Contract, Identifier, Instant, Metadata, Speaker, Text


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
