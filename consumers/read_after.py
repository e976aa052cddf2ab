"""Read-your-own-writes on the answer side: before a read whose question names `after` positions,
wait (bounded) until the ingest side has stored the turns topic through every one of them
(epistream/storage/watermarks.py says what "stored through" means; docs/read-your-writes.md).

A position no wait can meet (on a partition the topic does not have, or at or past its partition's
end: nothing was produced there) is not waited for: the reply says so at once, instead of spending the
whole bound on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from epistream.contracts.positions import Position
from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.storage.watermarks import stored_through, unmet

#: The first pause between polls, and the longest: a turn is usually stored within a second, so
#: early polls are close together; later ones back off to keep an idle database quiet.
FIRST_POLL_S = 0.01
MAX_POLL_S = 0.25

#: How long a read waits before asking whether its positions lie past their partitions' end: most are
#: stored well within it (so the common read asks the broker nothing), and the end a broker lists (its
#: high watermark) may trail, for a moment, a record a producer with acks=1 was just told of.
PAST_END_AFTER_S = 1.0

Marks = Callable[[Sequence[int]], Awaitable[Mapping[int, int]]]
#: A position no wait can meet, and why.
Never = tuple[Position, str]


class TurnsLog(Protocol):
    """What the turns topic's log says (epistream.messaging.log_ends.LogEnds)."""

    async def lacking(self, partitions: Set[int]) -> set[int]:
        """Those of `partitions` the topic does not have (none when the broker cannot say)."""
        ...

    async def ends(self) -> Mapping[int, int] | None:
        """Each partition's end offset, or None when the broker cannot say."""
        ...


def past_the_end(positions: Sequence[Position], ends: Mapping[int, int]) -> list[Never]:
    """The positions at or past their partition's end: nothing was produced there."""
    return [(p, f"partition {p.partition} ends at {ends[p.partition]}")
            for p in positions if p.partition in ends and p.offset >= ends[p.partition]]


async def wait_or_name(positions: Sequence[Position], marks: Marks, log: TurnsLog | None, *, timeout_s: float,
                       sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                       clock: Callable[[], float] = time.monotonic) -> tuple[list[Position], list[Never]]:
    """Wait for `positions` as `wait_until_stored` does, naming instead of waiting for those no wait can
    meet: on a partition the topic lacks (at once), or past their partition's end (once the read has
    waited `PAST_END_AFTER_S`). Returns the positions still not stored, and those named."""
    never: list[Never] = []
    waitable = list(positions)
    if log is not None:
        lacking = await log.lacking({p.partition for p in positions})
        never = [(p, f"no partition {p.partition}") for p in positions if p.partition in lacking]
        waitable = [p for p in positions if p.partition not in lacking]
    started = clock()
    first = timeout_s if log is None else min(PAST_END_AFTER_S, timeout_s)
    missing = await wait_until_stored(waitable, marks, timeout_s=first, sleep=sleep, clock=clock)
    if missing and log is not None and (ends := await log.ends()) is not None:
        past = past_the_end(missing, ends)
        never += past
        missing = [p for p in missing if p not in {q for q, _ in past}]
    left = timeout_s - (clock() - started)
    if missing and left > 0:
        missing = await wait_until_stored(missing, marks, timeout_s=left, sleep=sleep, clock=clock)
    return missing, never


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


def _named(items: Sequence[str]) -> str:
    return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def incomplete_reason(missing: Sequence[Position], timeout_s: float) -> str:
    """What the reply says when it read without every position stored (a few named, the rest counted)."""
    named = _named([f"{p.conversation_id}@{p.partition}:{p.offset}" for p in missing])
    return f"not stored within {timeout_s:g}s: {named}; the read may miss those turns"


def never_reason(never: Sequence[Never], topic: str) -> str:
    """What the reply says of positions nothing was ever produced at (read at once, without waiting)."""
    named = _named([f"{p.conversation_id}@{p.partition}:{p.offset} ({why})" for p, why in never])
    return f"never produced to {topic}: {named}; not waited for"


@tracing.traced("read after")  # the wait for the asked positions to be stored
async def read_after(pool: AsyncConnectionPool, topic: str, positions: Sequence[Position] | None, *,
                     timeout_s: float, metrics: Metrics, log: TurnsLog | None = None) -> str | None:
    """Wait for `positions` on `topic`; None when all are stored (or none given), else the reason the
    reply is incomplete (counted in the metrics). With the topic's `log`, positions nothing was produced
    at are named instead of waited for."""
    if not positions:
        return None
    started = time.perf_counter()

    async def marks(partitions: Sequence[int]) -> Mapping[int, int]:
        return await stored_through(pool, topic, partitions)

    missing, never = await wait_or_name(positions, marks, log, timeout_s=timeout_s)
    outcome = "timed_out" if missing else "never_produced" if never else "stored"
    metrics.read_after_wait_seconds.labels(outcome).observe(time.perf_counter() - started)
    if not missing and not never:
        return None
    metrics.reads_incomplete.inc()
    reasons = ([never_reason(never, topic)] if never else []) + ([incomplete_reason(missing, timeout_s)] if missing else [])
    return "; ".join(reasons)
