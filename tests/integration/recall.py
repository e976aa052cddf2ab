"""Read-your-own-writes as the tests of it ask: a turn of words of its own, read back by a `context`
question that waits for its position (test_read_your_writes.py, test_standby_reads.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta

from epistream.client.api import context
from epistream.contracts.positions import Position
from epistream.contracts.replies import MemoryContext
from epistream.contracts.turns import Turn
from epistream.settings.processes import Settings


def own_turn(tenant: str, conversation: str, n: int, *, t0: datetime) -> Turn:
    # Words of its own per turn, so the read that asks for them finds this turn and no other.
    return Turn(tenant=tenant, conversation_id=conversation, turn_id=f"t{n:04d}", speaker="Ana",
                text=f"My locker number {n} holds the {uuid.uuid4().hex[:6]} parcel from Lisbon.",
                ts=t0 + timedelta(minutes=n))


async def recall(settings: Settings, turn: Turn, positions: dict[str, Position] | list[Position], *,
                 bound_s: float) -> tuple[MemoryContext, float]:
    """A `context` read for the turn's own words once `positions` are stored (the deployment's bound is
    `bound_s`), and how long it took."""
    started = time.monotonic()
    reply = await context(settings, tenant=turn.tenant, question=turn.text, conversation_ids=[turn.conversation_id],
                          budget_tokens=200, after=positions, timeout_s=bound_s + 60)
    return reply, time.monotonic() - started


def recall_now(settings: Settings, turn: Turn, positions: dict[str, Position], *, bound_s: float
               ) -> tuple[MemoryContext, float]:
    return asyncio.run(recall(settings, turn, positions, bound_s=bound_s))


def holds(reply: MemoryContext, turn: Turn) -> bool:
    return any(item.turn_id == turn.turn_id for item in reply.items if item.kind == "turn")
