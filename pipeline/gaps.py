"""The second line behind a consumer that drops records: gaps under the read-your-own-writes mark.

The mark never passes a missing offset (sql/022): records Faust fetched and never handed to the agent,
or acknowledged while skipping them (faust/streams.py's generation check: the commit then passes
them, and the stall guard, which watches the committed offset, sees nothing), leave a gap above the
mark while later records are stored. A gap that outlives EPISTREAM_WATERMARK_GAP_GRACE_S (a batch in flight closes
its own in milliseconds) is read from the log with a read-committed consumer of its own:

- the log holds records there: they were skipped. The partition is sought back to the gap, and the
  records from there are handled again (every handler is idempotent). The same gap again after that:
  the consumer itself is stuck, and the process exits to be started afresh from the committed offsets
  (pipeline/redelivery.py's last resort), which a gap below them does not help: the ingest worker
  seeks the new consumer to the gap on its first tick past the grace.
- it holds none (transaction markers and aborted records of a third party's transactional producer,
  or offsets retention has deleted): nothing there will ever be stored, and the gap is filled.
- the broker cannot say (away, or a transaction still open there): the next tick asks again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

import faust
from faust.types import TP
from psycopg_pool import AsyncConnectionPool

from epistream.core.metrics import Metrics
from epistream.messaging.kafka_io import records_between
from epistream.settings.processes import Settings
from epistream.storage import watermarks

from .redelivery import SEEK_TIMEOUT_S, exit_to_be_restarted

log = logging.getLogger(__name__)

#: A gap: (its first offset, the next stored offset).
Gap = tuple[int, int]


@dataclass
class GapWatch:
    """Times each partition's gap, and remembers where it sought one back to."""

    grace_s: float
    _since: dict[int, tuple[Gap, float]] = field(default_factory=dict)
    _sought: dict[int, Gap] = field(default_factory=dict)

    def due(self, found: Mapping[int, Gap], mine: Set[int], now: float) -> list[tuple[int, Gap]]:
        """The gaps of `mine` (this worker's partitions) seen unchanged for `grace_s`, each then timed
        afresh; a gap that changed or closed starts again, or is forgotten."""
        for partition in list(self._since):
            if partition not in mine or found.get(partition) != self._since[partition][0]:
                del self._since[partition]
        for partition in list(self._sought):
            if found.get(partition) != self._sought[partition]:
                del self._sought[partition]  # closed or moved after the seek: the seek worked
        due = []
        for partition, gap in sorted(found.items()):
            if partition not in mine:
                continue
            seen, since = self._since.setdefault(partition, (gap, now))
            if now - since >= self.grace_s:
                due.append((partition, seen))
                self._since[partition] = (gap, now)
        return due

    def sought(self, partition: int, gap: Gap) -> bool:
        """Note a seek back to `gap`; False when the partition was sought back to that same gap before."""
        again = self._sought.get(partition) == gap
        self._sought[partition] = gap
        return not again


async def heal_gaps(app: faust.App, settings: Settings, pool: AsyncConnectionPool, watch: GapWatch,
                    metrics: Metrics) -> None:
    """One tick: find the gaps under the marks of `settings.topic_turns` on this worker's partitions, and
    act on those past their grace (module docstring)."""
    topic = settings.topic_turns
    if app.rebalancing:
        return
    mine = {tp.partition for tp in app.consumer.assignment() if tp.topic == topic}
    for partition, (first, end) in watch.due(await watermarks.gaps(pool, topic), mine, time.monotonic()):
        held = await records_between(settings, topic, partition, first, end)
        if held is None:
            continue
        if not held:
            log.info("%s[%d] offsets %d..%d hold no record a consumer is given (transaction markers, aborted "
                     "or deleted records): marked done", topic, partition, first, end - 1)
            metrics.watermark_gaps.labels("empty").inc()
            async with pool.connection() as conn, conn.transaction():
                await watermarks.advance(conn, {(topic, partition): [(first, end - 1)]})
            continue
        if not watch.sought(partition, (first, end)):
            metrics.watermark_gaps.labels("restart").inc()
            log.error("%s[%d]: records %d..%d still not handed over after a seek back to them: exiting, to be "
                      "started afresh", topic, partition, first, end - 1)
            exit_to_be_restarted()
        metrics.watermark_gaps.labels("skipped").inc()
        log.warning("%s[%d]: records %d..%d were never stored while later ones were (fetched and dropped, or "
                    "acknowledged unhandled): seeking back to %d", topic, partition, first, end - 1, first)
        await asyncio.wait_for(app.consumer.seek(TP(topic, partition), first), timeout=SEEK_TIMEOUT_S)
