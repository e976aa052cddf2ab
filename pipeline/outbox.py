"""The segment outbox: a closed segment is sent to `memory.segments` whole, and marked published
only once Kafka has acknowledged it. A failed delivery leaves it unpublished, and the
housekeeping tick sends it again (enrichment is idempotent per segment)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from psycopg_pool import AsyncConnectionPool

from epistream.core import tracing
from epistream.storage.db import tenant_scope

from .store import segments

log = logging.getLogger(__name__)

#: Sends one segment (key, value) and returns once the broker has it (raises if it never does).
DeliveredSend = Callable[[bytes, bytes], Awaitable[object]]


async def publish(pool: AsyncConnectionPool, closed: Sequence[tuple[str, str]], send: DeliveredSend) -> int:
    """Send each (tenant, segment_id) and mark it published after its delivery; return how many were.
    A failure stops the round (the broker is likely away) and leaves the rest in the outbox."""
    published = 0
    try:
        async with pool.connection() as conn:
            for tenant, sid in closed:
                async with tenant_scope(conn, tenant):
                    segment = await segments.load_segment(conn, tenant, sid)
                    if segment is None:
                        continue  # forgotten since it was closed
                    # The record carries on the trace of the turn that closed the segment, where known.
                    with tracing.attached(tracing.origin(tenant, segment.conversation_id)):
                        await send(segment.conversation_id.encode(), segment.to_bytes())
                    await segments.mark_published(conn, tenant, [sid])
                published += 1
    except Exception as exc:
        log.warning("%d of %d segments published, the outbox will retry the rest: %s: %s",
                    published, len(closed), type(exc).__name__, exc)
    return published
