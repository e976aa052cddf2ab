"""Where a topic's log ends: its partitions and the next offset each will write, with clients kept for
the process's life (the answer worker asks, to tell a question's `after` position that a wait can
still meet from one it never can: consumers/read_after.py)."""

from __future__ import annotations

import logging
from collections.abc import Set

from aiokafka import TopicPartition

from epistream.settings.processes import ClientSettings

from .kafka_io import create_admin, create_consumer, topic_partitions

log = logging.getLogger(__name__)


class LogEnds:
    """`topic`'s partitions (kept, asked again only when a partition is not among them) and, on demand,
    the end offset of each; what the broker cannot say now is reported as unknown, never as an error."""

    def __init__(self, settings: ClientSettings, topic: str) -> None:
        self.topic = topic
        self._admin = create_admin(settings)
        # No group: it only lists offsets, never consumes or commits.
        self._consumer = create_consumer(settings, group_id=None, enable_auto_commit=False)
        self._partitions: frozenset[int] = frozenset()

    async def start(self) -> None:
        await self._admin.start()
        await self._consumer.start()

    async def close(self) -> None:
        # Both, whether or not they started (a client that failed to start still holds its connections).
        await self._consumer.stop()
        await self._admin.close()

    async def _refresh(self) -> bool:
        try:
            self._partitions = frozenset((await topic_partitions(self._admin, [self.topic]))[self.topic])
        except Exception as exc:  # the broker away: the caller waits as if it had not asked
            log.debug("the partitions of %s unavailable: %s", self.topic, exc)
            return False
        return True

    async def lacking(self, partitions: Set[int]) -> set[int]:
        """Those of `partitions` the topic does not have; a metadata request only for one not known yet
        (a partition added since is then found), none when the broker cannot say."""
        if not partitions <= self._partitions and not await self._refresh():
            return set()
        return set(partitions - self._partitions)

    async def ends(self) -> dict[int, int] | None:
        """Each partition's end offset (the next offset it will write), or None when the broker cannot say."""
        if not self._partitions and not await self._refresh():
            return None
        try:
            ends = await self._consumer.end_offsets([TopicPartition(self.topic, p) for p in sorted(self._partitions)])
        except Exception as exc:
            log.debug("the end of %s unavailable: %s", self.topic, exc)
            return None
        return {tp.partition: end for tp, end in ends.items()}
