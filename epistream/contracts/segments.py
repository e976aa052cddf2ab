"""`memory.segments`: a closed segment, whole, the enrich worker's unit of work."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
)

from .base import Contract


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
