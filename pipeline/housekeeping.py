"""The indexer's periodic work: close idle conversations (through memory.turns, in order with the
turns, so a replay closes the same segments) and re-publish the segment outbox. A failed tick
(PostgreSQL restarting, the broker away) is logged and counted; the next tick runs as usual."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from psycopg_pool import AsyncConnectionPool

from epistream.contracts.turns import SegmentCloseRequest
from epistream.core.metrics import Metrics

from .store import segments

log = logging.getLogger(__name__)

# A segment left unpublished this long was orphaned by a crash or a failed delivery.
OUTBOX_GRACE_S = 30.0


async def guarded(name: str, tick: Callable[[], Awaitable[object]], metrics: Metrics) -> bool:
    """Run one tick of a periodic task; a failure is logged and counted, never raised (a timer that
    raises stops the worker). Cancellation still propagates. True when the tick succeeded."""
    try:
        await tick()
    except Exception as exc:
        metrics.task_failures.labels(name, type(exc).__name__).inc()
        log.warning("%s failed, next tick as usual: %s: %s", name, type(exc).__name__, exc)
        return False
    return True


async def tick(
    pool: AsyncConnectionPool,
    *,
    idle_s: float,
    send_close: Callable[[bytes, bytes, str], Awaitable[object]],
    publish: Callable[[list[tuple[str, str]]], Awaitable[object]],
) -> None:
    """One housekeeping round: a close request per idle conversation, then the outbox's orphans."""
    async with pool.connection() as conn:
        idle = await segments.idle_conversations(conn, idle_s)
        orphans = await segments.unpublished(conn, OUTBOX_GRACE_S)
    for tenant, conversation_id, last_turn_id in idle:
        request = SegmentCloseRequest(
            kind="segment_close", tenant=tenant, conversation_id=conversation_id, after_turn_id=last_turn_id
        )
        await send_close(conversation_id.encode(), request.to_bytes(), tenant)
    if orphans:
        await publish(orphans)
