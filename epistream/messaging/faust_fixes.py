"""A fix to Faust (faust-streaming 0.15.3), applied when a worker imports its bootstrap
(pipeline/bootstrap.py): Faust's commit never passes a record it fetched and no agent acknowledged.

Faust commits, per partition, the end of the first run of consecutive acknowledged offsets
(`Consumer._new_offset`, faust/transport/consumer.py). Its guard against a hole before that run reads
`min(acked) - committed > 1`, where `committed` is the next offset to read: a hole of exactly one
offset at the committed position passes, and a partition never committed (None) has no guard at all.
The tolerance has a use: the offset at the committed position may be a transaction marker, which a
consumer never receives. But a *record* there that Faust fetched and dropped (a message of an old
generation, or one met while flow is stopped, which the stream skips without acknowledging it) is then
committed past as soon as its successors are acknowledged: lost to the group, never read again.

The fix tells the two apart by what the consumer really fetched: it notes each offset the driver turns
into a message (`_to_message`), and a partition with a fetched offset between its committed offset and
its first acknowledged one commits nothing until that record is acknowledged (fetched again after the
next seek, or sought back by the stall guard, pipeline/redelivery.py). Offsets never fetched (markers,
compacted records) keep Faust's own rule. Upstream, the change is to track fetched-but-unacknowledged
offsets (or let `getmany` note the positions it skips) and hold the commit below them.

Not covered: with NO_CYTHON set, Faust's pure-Python iterator acknowledges the records it skips, which
no fix here can tell from handled ones; the workers run the compiled iterator faust-streaming ships.

Tests: tests/unit/test_faust_commit_rule.py runs Faust's own `_new_offset` with and without the fix;
tests/integration/test_faust_rebalances.py drives real rebalances on the real broker.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_APPLIED = "_epistream_commit_fix"
_FETCHED = "_epistream_fetched"  # per consumer: TP -> offsets fetched and not yet committed past
_FAUST_NEW_OFFSET = "_faust_new_offset"  # Faust's own rule, kept on the class once the fix wraps it


def held_back(committed: int | None, first_acked: int, fetched: set[int]) -> bool:
    """Whether a fetched record lies below the first acknowledged offset and not below the committed
    one: a record no agent acknowledged, which a commit past `first_acked` would lose. Prunes `fetched`
    of what the group has committed past."""
    if committed is not None:
        fetched.difference_update([offset for offset in fetched if offset < committed])
    return any(offset < first_acked for offset in fetched)


def _fetched(consumer: Any) -> defaultdict[Any, set[int]]:
    table: defaultdict[Any, set[int]] | None = consumer.__dict__.get(_FETCHED)
    if table is None:  # the first record this consumer fetched
        table = defaultdict(set)
        consumer.__dict__[_FETCHED] = table
    return table


def faust_rule() -> Callable[[Any, Any], int | None]:
    """Faust's own `_new_offset`, with the fix applied or not (what its test compares against)."""
    from faust.transport.consumer import Consumer

    rule: Callable[[Any, Any], int | None] = getattr(Consumer, _FAUST_NEW_OFFSET, Consumer._new_offset)
    return rule


def apply() -> None:
    """Install the fix on Faust's consumer; calling it again changes nothing."""
    from faust.transport.consumer import Consumer
    from faust.transport.drivers.aiokafka import Consumer as KafkaConsumer

    if getattr(Consumer, _APPLIED, False):
        return
    new_offset: Callable[[Any, Any], int | None] = Consumer._new_offset
    to_message: Callable[[Any, Any, Any], Any] = KafkaConsumer._to_message

    def _to_message(self: Any, tp: Any, record: Any) -> Any:
        _fetched(self)[tp].add(record.offset)
        return to_message(self, tp, record)

    def _new_offset(self: Any, tp: Any) -> int | None:
        acked = self._acked[tp]
        if acked and held_back(self._committed_offset[tp], min(acked), _fetched(self)[tp]):
            log.debug("not committing %s: a fetched record below offset %d was never acknowledged", tp, min(acked))
            return None
        return new_offset(self, tp)

    setattr(Consumer, _FAUST_NEW_OFFSET, new_offset)
    KafkaConsumer._to_message = _to_message  # type: ignore[method-assign]
    Consumer._new_offset = _new_offset  # type: ignore[method-assign]
    setattr(Consumer, _APPLIED, True)
