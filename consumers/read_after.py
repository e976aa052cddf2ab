"""Read-your-own-writes on the answer side: before a read whose question names `after` positions,
wait (bounded) until the ingest side has stored the turns topic through every one of them
(epistream/storage/watermarks.py says what "stored through" means; docs/read-your-writes.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from psycopg_pool import AsyncConnectionPool

from epistream.contracts.positions import Position
from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.storage.watermarks import stored_through, unmet

#: The first pause between polls, and the longest: a turn is usually stored within a second, so
#: early polls are close together; later ones back off to keep an idle database quiet.
FIRST_POLL_S = 0.01
MAX_POLL_S = 0.25

Marks = Callable[[Sequence[int]], Awaitable[Mapping[int, int]]]


async def wait_until_stored(positions: Sequence[Position], marks: Marks, *, timeout_s: float,
                            sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                            clock: Callable[[], float] = time.monotonic) -> list[Position]:
    """Poll `marks` (partition -> stored through) until every position is stored or `timeout_s` has
    passed; return the positions still not stored (empty: all are)."""
    deadline = clock() + timeout_s
    pause = FIRST_POLL_S
    missing = list(positions)
    while missing:
        missing = unmet(missing, await marks(sorted({p.partition for p in missing})))
        left = deadline - clock()
        if not missing or left <= 0:
            break
        await sleep(min(pause, left))
        pause = min(pause * 2, MAX_POLL_S)
    return missing


def incomplete_reason(missing: Sequence[Position], timeout_s: float) -> str:
    """What the reply says when it read without every position stored (a few named, the rest counted)."""
    named = ", ".join(f"{p.conversation_id}@{p.partition}:{p.offset}" for p in missing[:3])
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return f"not stored within {timeout_s:g}s: {named}{more}; the read may miss those turns"


@tracing.traced("read after")  # the wait for the asked positions to be stored
async def read_after(pool: AsyncConnectionPool, topic: str, positions: Sequence[Position] | None, *,
                     timeout_s: float, metrics: Metrics) -> str | None:
    """Wait for `positions` on `topic`; None when all are stored (or none given), else the reason the
    reply is incomplete (counted in the metrics)."""
    if not positions:
        return None
    started = time.perf_counter()
    missing = await wait_until_stored(positions, lambda parts: stored_through(pool, topic, parts),
                                      timeout_s=timeout_s)
    outcome = "timed_out" if missing else "stored"
    metrics.read_after_wait_seconds.labels(outcome).observe(time.perf_counter() - started)
    if not missing:
        return None
    metrics.reads_incomplete.inc()
    return incomplete_reason(missing, timeout_s)
