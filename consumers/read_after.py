"""Read-your-own-writes on the answer side: before a read whose question names `after` positions,
wait (bounded) until the ingest side has stored the turns topic through every one of them
(epistream/storage/watermarks.py says what "stored through" means; docs/read-your-writes.md).

A position no wait can meet (on a partition the topic does not have, or at or past its partition's
end: nothing was produced there) is not waited for: the reply says so at once, instead of spending the
whole bound on it."""

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

#: How long a position at or past its partition's end is given before it counts as never produced: the
#: end a broker lists (its high watermark) may trail, for a moment, a record a producer with acks=1 was
#: just told of; a record acknowledged by every replica (the project's client: acks=all) is below it.
PAST_END_GRACE_S = 1.0

Marks = Callable[[Sequence[int]], Awaitable[Mapping[int, int]]]
#: The turns topic's partitions and the end offset of each (epistream.messaging.log_ends), None when
#: the broker cannot say now.
Ends = Callable[[], Awaitable[Mapping[int, int] | None]]
#: A position no wait can meet, and why.
Never = tuple[Position, str]


def never_produced(positions: Sequence[Position], ends: Mapping[int, int]) -> list[Never]:
    """The positions on a partition the topic does not have, or at or past their partition's end."""
    return [(p, f"no partition {p.partition}") if p.partition not in ends
            else (p, f"partition {p.partition} ends at {ends[p.partition]}")
            for p in positions if p.partition not in ends or p.offset >= ends[p.partition]]


async def split_never_produced(positions: Sequence[Position], marks: Marks, ends: Ends, *, grace_s: float,
                               sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                               ) -> tuple[list[Position], list[Never]]:
    """The positions not stored yet, split into those a wait can still meet and those it never can. A
    missing partition is final at once; a position past its partition's end gets `grace_s` first."""
    missing = unmet(positions, await marks(sorted({p.partition for p in positions})))
    listed = await ends() if missing else None
    if listed is None:
        return missing, []
    found = never_produced(missing, listed)
    never = [(p, why) for p, why in found if p.partition not in listed]
    past = [p for p, _ in found if p.partition in listed]
    if past:
        await sleep(grace_s)
        past = unmet(past, await marks(sorted({p.partition for p in past})))
        never += never_produced(past, await ends() or listed)
    given_up = {p for p, _ in never}
    return [p for p in missing if p not in given_up], never


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
                     timeout_s: float, metrics: Metrics, ends: Ends | None = None) -> str | None:
    """Wait for `positions` on `topic`; None when all are stored (or none given), else the reason the
    reply is incomplete (counted in the metrics). With `ends`, positions nothing was produced at are
    named at once instead of waited for."""
    if not positions:
        return None
    started = time.perf_counter()

    async def marks(partitions: Sequence[int]) -> Mapping[int, int]:
        return await stored_through(pool, topic, partitions)

    never: list[Never] = []
    missing = list(positions)
    if ends is not None:
        missing, never = await split_never_produced(positions, marks, ends,
                                                    grace_s=min(PAST_END_GRACE_S, timeout_s))
    if missing:
        left = max(0.0, timeout_s - (time.perf_counter() - started))
        missing = await wait_until_stored(missing, marks, timeout_s=left)
    outcome = "timed_out" if missing else "never_produced" if never else "stored"
    metrics.read_after_wait_seconds.labels(outcome).observe(time.perf_counter() - started)
    if not missing and not never:
        return None
    metrics.reads_incomplete.inc()
    reasons = ([never_reason(never, topic)] if never else []) + ([incomplete_reason(missing, timeout_s)] if missing else [])
    return "; ".join(reasons)
