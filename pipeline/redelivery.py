"""Records Faust fetched but never handed to an agent are fetched again.

What Faust does (faust-streaming 0.15.3, read at issue 39): its consumer's `getmany`
(faust/transport/consumer.py) stops yielding a fetched batch when flow control stops or the consumer's
generation changes, and the fetcher's loop still sets its read offset for what it handed on, so copies
fetched again below that offset are dropped as already read ("DROPPED MESSAGE ROFF"); and after a
rebalance the table recovery (faust/tables/recovery.py, `_resume_streams`) can return on a generation
mismatch with partitions paused and flow suspended. Those paths leave records neither handled nor
acknowledged: the committed offset stops below them, and nothing reads them again until the partition
is next sought to it. Seen after a broker outage longer than the session timeout: the worker rejoined
its group with the same partitions, its agent sat idle, and the segments behind the committed offset
waited until the broker went away again. A third path is worse and is not this guard's: a record the
stream skips for an old generation or inactive flow (faust/streams.py and its Cython twin, the
generation check) is not acknowledged, and Faust's commit rule lets a hole of one offset at the
committed position pass once its successors are acknowledged: lost to the group, not stalled. That one
is fixed where it happens, at import (epistream.messaging.faust_fixes); the store's own second line is
the read-your-own-writes mark, which never passes a skipped turn and heals it from Kafka (gaps.py).
Real rebalances and broker pauses on the real broker have not produced any of these drops so far
(epistream.testing.rebalance_probe; docs/read-your-writes.md says what was tried).

The guard notices the symptom from outside Faust, so it does not depend on which path dropped them: a
partition of this worker whose committed offset (the log's start, when retention deleted past it or
the group never committed) trails the end of the log, has not moved for `stall_s` of the agent's idle
time (an agent at work may have that partition's records queued behind the one it holds), with no
record of that partition in flight. Then that partition is sought back to its
committed offset (as Faust does after a rebalance) and the records come again. Stalled again at the
same offset after that, the consumer itself is stuck: the process exits and its supervisor starts a
fresh one, which reads from the committed offsets. A record handled twice is harmless: every handler
is idempotent (a stored turn, an enriched segment, is skipped)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import NoReturn

import faust
from faust.types import TP

from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.messaging.kafka_io import PartitionLag

log = logging.getLogger(__name__)

#: Far longer than a record can sit between fetch and agent (a batch window, a commit interval: seconds),
#: short enough that what was dropped waits a minute, not until the next outage.
STALL_S = 60.0
SEEK_TIMEOUT_S = 30.0  # a seek that cannot finish fails the tick; the next verdict restarts
EXIT_STALLED = 70  # EX_SOFTWARE: the supervisor (or the orchestrator) starts the worker again


class StallGuard:
    """Counts the records an agent holds, per partition (`handling`), and tells from the group's lag
    what to do about the partitions that stalled (`verdict`).

    A partition's stall clock runs only while the agent holds nothing at all: while it works on any
    record, the fetched records of other partitions may simply be queued behind it in Faust's buffer (an
    enrich worker holds one segment for a model call of up to minutes), which a dropped record cannot be
    told from. Clocks pause while it works and resume when it is idle, so a partition is called stalled
    after `stall_s` of the agent's idle time: as soon as it could have taken the records and did not."""

    def __init__(self, stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s = stall_s
        self.clock = clock
        self._held: Counter[tuple[str, int]] = Counter()  # (topic, partition) -> records in flight
        self._busy_s = 0.0  # time spent holding at least one record, up to `_busy_since`
        self._busy_since: float | None = None  # when the agent last went from idle to busy; None: idle
        # (topic, partition) -> (its committed offset, the idle clock when it was first seen trailing there)
        self._trailing: dict[tuple[str, int], tuple[int, float]] = {}
        # (topic, partition) -> the committed offset it was sought back to
        self._sought: dict[tuple[str, int], int] = {}
        # (topic, partition) -> (committed, end) where the log holds no record between: nothing to fetch
        self._empty: dict[tuple[str, int], tuple[int, int]] = {}

    @property
    def in_flight(self) -> int:
        return sum(self._held.values())

    def idle_clock(self, now: float) -> float:
        """Seconds the agent has spent holding nothing (since an arbitrary origin): it moves only while idle."""
        busy = self._busy_s + (now - self._busy_since if self._busy_since is not None else 0.0)
        return now - busy

    @contextlib.contextmanager
    def handling(self, partitions: Iterable[tuple[str, int]]) -> Iterator[None]:
        """Around the handling of records of `partitions` (one entry a record), from their arrival until
        they are acknowledged."""
        held = Counter((str(t), int(p)) for t, p in partitions)
        if not self.in_flight:
            self._busy_since = self.clock()
        self._held.update(held)
        try:
            yield
        finally:
            self._held.subtract(held)
            self._held = +self._held  # drop the zeros: the counter stays as small as what is in flight
            if not self.in_flight and self._busy_since is not None:
                self._busy_s += self.clock() - self._busy_since
                self._busy_since = None

    def stalled(self, lag: PartitionLag, assigned: Iterable[tuple[str, int]], now: float) -> list[tuple[str, int]]:
        """The assigned partitions that trail at one committed offset for `stall_s` of the agent's idle
        time with none of their records in flight (then forgotten: each is timed afresh). A partition's
        record in flight restarts its clock, and only its."""
        mine = {(str(t), int(p)) for t, p in assigned}
        trailing = {tp: seen for tp, seen in lag.items()
                    if tp in mine and seen[0] < seen[1] and not self._held.get(tp) and self._empty.get(tp) != seen}
        for tp in list(self._trailing):
            if tp not in trailing or self._trailing[tp][0] != trailing[tp][0]:
                del self._trailing[tp]  # caught up, moved on, in flight, or no longer this worker's
        idle = self.idle_clock(now)
        for tp, (committed, _) in trailing.items():
            self._trailing.setdefault(tp, (committed, idle))
        stalled = sorted(tp for tp, (_, since) in self._trailing.items() if idle - since >= self.stall_s)
        for tp in stalled:
            del self._trailing[tp]
        return stalled

    def nothing_to_fetch(self, tp: tuple[str, int], committed: int, end: int) -> None:
        """The log holds no record a consumer is given between `committed` and `end` (a transaction's
        marker last, say): the partition is caught up there, not stalled, until either moves."""
        self._empty[tp] = (committed, end)
        self._sought.pop(tp, None)

    def verdict(self, lag: PartitionLag, assigned: Iterable[tuple[str, int]], now: float) -> tuple[str, list[tuple[str, int]]]:
        """("seek", partitions) for a first stall; ("restart", partitions) when one stalls again at the
        offset it was sought back to (the seek brought nothing: the consumer itself is stuck, and a new
        process resumes from the committed offsets); ("ok", []) otherwise."""
        for tp in list(self._sought):
            if lag.get(tp, (None, None))[0] != self._sought[tp]:
                del self._sought[tp]  # it moved after the seek: the seek worked
        stalled = self.stalled(lag, assigned, now)
        if not stalled:
            return "ok", []
        if any(self._sought.get(tp) == lag[tp][0] for tp in stalled):
            return "restart", stalled
        self._sought.update({tp: lag[tp][0] for tp in stalled})
        return "seek", stalled


#: Whether the log holds a record a consumer is given in [first, end) of a topic's partition: True,
#: False, or None when the broker cannot say (messaging.kafka_io.records_between).
HoldsRecords = Callable[[str, int, int, int], Awaitable[bool | None]]


async def seek_back_if_stalled(app: faust.App, guard: StallGuard, lag: PartitionLag | None, metrics: Metrics,
                               holds_records: HoldsRecords) -> str:
    """Act on the guard's verdict: seek the stalled partitions back to their committed offsets (the
    start, for a group that never committed), or end the process (its supervisor starts it again);
    nothing while the group rebalances (Faust seeks then itself). A partition whose log holds nothing
    a consumer is given past its committed offset (a third party's transaction ended with a marker the
    consumer never receives, so the commit stays one short of the end until the next record) is caught
    up, not stalled. Returns the verdict."""
    if lag is None or app.rebalancing:
        return "ok"
    verdict, stalled = guard.verdict(lag, app.consumer.assignment(), time.monotonic())
    if verdict == "ok":
        return verdict
    for tp in list(stalled):
        committed, end = lag[tp]
        if await holds_records(tp[0], tp[1], committed, end) is False:
            guard.nothing_to_fetch(tp, committed, end)
            stalled.remove(tp)
    if not stalled:
        return "ok"
    where = ", ".join(f"{t}[{p}]" for t, p in stalled)
    metrics.consumer_reseeks.labels(app.conf.id, verdict).inc()
    if verdict == "seek":
        log.warning("%s: %s trailed the end of the log for %.0fs with no record in flight (fetched and dropped); "
                    "seeking back to the committed offsets", app.conf.id, where, guard.stall_s)
        for topic, partition in stalled:
            await asyncio.wait_for(app.consumer.seek(TP(topic, partition), lag[(topic, partition)][0]),
                                   timeout=SEEK_TIMEOUT_S)
        return verdict
    log.error("%s: %s still stalled at the offset it was sought back to: exiting, to be started afresh (by "
              "its supervisor) from the committed offsets", app.conf.id, where)
    exit_to_be_restarted()


def exit_to_be_restarted() -> NoReturn:
    """End the process at once with EXIT_STALLED; its supervisor starts a fresh one. Not a graceful stop:
    that waits for every record the consumer holds unacknowledged to be acknowledged, and a dropped one
    never is. Nothing is in flight, and what is not committed is read again."""
    tracing.shutdown()  # os._exit skips the exporter's own exit hook: the spans of the stall go out first
    logging.shutdown()
    os._exit(EXIT_STALLED)
