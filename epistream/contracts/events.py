"""`memory.events`: what a memory event announces (docs/events.md).

One flat contract for the five kinds; the fields a kind does not use are absent (null). An event's id
is derived from the change it announces, so the same change written again (a replay of the same
records, a redelivered segment enriched the same way) carries the same id and a reader drops it.
Events hold ids, counts and positions, never the text of a turn, gist or fact."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Literal

from pydantic import Field

from .base import Contract, Identifier, Instant

EventKind = Literal["turns_stored", "segment_closed", "segment_enriched", "fact_superseded", "conversation_forgotten"]
KINDS: tuple[EventKind, ...] = ("turns_stored", "segment_closed", "segment_enriched", "fact_superseded",
                                "conversation_forgotten")


class MemoryEvent(Contract):
    """`memory.events` (or a tenant's own events topic), keyed by conversation id ('' for a tenant-wide one)."""

    event_id: str = Field(description="Stable per change: dedupe on it (delivery is at least once).")
    kind: EventKind
    tenant: Identifier
    conversation_id: Identifier | None = Field(None, description="None only for a whole-tenant forget.")
    occurred_at: Instant = Field(description="The time of the transaction that made the change (its start).")
    # turns_stored: the turns of this conversation in one stored chunk, through this Kafka position.
    partition: int | None = Field(None, description="turns_stored: memory.turns partition of the last turn.")
    offset: int | None = Field(None, description="turns_stored: its offset: stored through here.")
    # turns_stored and segment_closed: which turns (in partition order).
    first_turn_id: str | None = None
    last_turn_id: str | None = None
    turn_count: int | None = Field(None, description="turns_stored: turns inserted or changed; segment_closed: "
                                   "turns in the segment.")
    # segment_closed and segment_enriched.
    segment_id: str | None = None
    # segment_enriched: what the enrichment stored (it replaces what the segment had before).
    gist_ids: list[str] | None = None
    fact_ids: list[str] | None = None
    gist_count: int | None = None
    fact_count: int | None = None
    # fact_superseded: `fact_id` is no longer current; `superseded_by` is the fact that now is.
    fact_id: str | None = None
    superseded_by: str | None = None
    # conversation_forgotten.
    scope: Literal["conversation", "tenant"] | None = None

    def key(self) -> bytes:
        return (self.conversation_id or "").encode()


def event_id(kind: EventKind, tenant: str, conversation_id: str | None, *identity: object) -> str:
    """A stable id from what makes the change itself (never from a time): sha256 of its parts, 32 hex."""
    canonical = json.dumps([kind, tenant, conversation_id, *identity], sort_keys=True, default=str,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def new_event(kind: EventKind, tenant: str, conversation_id: str | None, occurred_at: datetime, *,
              identity: tuple[object, ...], **fields: object) -> MemoryEvent:
    """An event whose id is derived from `identity` (what distinguishes this change from another)."""
    return MemoryEvent.model_validate({
        "event_id": event_id(kind, tenant, conversation_id, *identity), "kind": kind, "tenant": tenant,
        "conversation_id": conversation_id, "occurred_at": occurred_at, **fields})
