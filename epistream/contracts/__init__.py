"""Typed message contracts, one frozen model per topic value, one module per kind of message.

Every value is JSON (UTF-8). Unknown fields are rejected so a producer's typo is dead-lettered instead
of silently dropped. This face names every contract for those who import from ``epistream.contracts``;
the project's own code imports from the modules (``epistream.contracts.turns``), and the contracts a
caller builds or receives are also in ``epistream`` itself."""

from __future__ import annotations

from .base import (
    EARLIEST,
    LATEST,
    METADATA_MAX_DEPTH,
    SCHEMA_VERSION,
    Contract,
    Identifier,
    Instant,
    Metadata,
    Speaker,
    Text,
    TopicName,
)
from .dead_letters import DeadLetter
from .decoding import decode, validated
from .events import KINDS, EventKind, MemoryEvent, event_id, new_event
from .positions import Position
from .questions import (
    CONTEXT_BUDGET_DEFAULT,
    CONTEXT_BUDGET_MAX,
    CONTEXT_BUDGET_MIN,
    CONTEXT_MODES,
    Budget,
    Mode,
    Question,
    TimeRange,
    check_budget,
)
from .replies import Answer, Evidence, MemoryContext, MemoryItem, Progress, ProgressStep, ResolvedPeriod, RoleTokens
from .segments import Segment, SegmentTurn
from .turns import ForgetRecord, SegmentCloseRequest, Turn

__all__ = [
    "Answer",
    "Budget",
    "CONTEXT_BUDGET_DEFAULT",
    "CONTEXT_BUDGET_MAX",
    "CONTEXT_BUDGET_MIN",
    "CONTEXT_MODES",
    "Contract",
    "DeadLetter",
    "EARLIEST",
    "EventKind",
    "Evidence",
    "ForgetRecord",
    "Identifier",
    "Instant",
    "KINDS",
    "LATEST",
    "METADATA_MAX_DEPTH",
    "MemoryContext",
    "MemoryEvent",
    "MemoryItem",
    "Metadata",
    "Mode",
    "Position",
    "Progress",
    "ProgressStep",
    "Question",
    "ResolvedPeriod",
    "RoleTokens",
    "SCHEMA_VERSION",
    "Segment",
    "SegmentCloseRequest",
    "SegmentTurn",
    "Speaker",
    "Text",
    "TimeRange",
    "TopicName",
    "Turn",
    "check_budget",
    "decode",
    "event_id",
    "new_event",
    "validated",
]
