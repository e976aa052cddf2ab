"""Where a topic's log ends: its partitions and the next offset each will write, read on demand with
clients kept for the process's life (the answer worker asks when a question's `after` positions are
not stored yet, to tell a position that can still be met from one that never will)."""

from __future__ import annotations

import logging

from aiokafka import TopicPartition

from epistream.settings.processes import ClientSettings

from .kafka_io import create_admin, create_consumer, topic_partitions

log = logging.getLogger(__name__)


class LogEnds:
    """`await ends()`: partition -> end offset of `topic`, or None when the broker cannot say now."""

    def __init__(self, settings: ClientSettings, topic: str) -> None:
        self.topic = topic
        self._admin = create_admin(settings)
        # No group: it only lists offsets, never consumes or commits.
        self._consumer = create_consumer(settings, group_id=None, enable_auto_commit=False)

    async def start(self) -> None:
        await self._admin.start()
        await self._consumer.start()

    async def close(self) -> None:
        # Both, whether or not they started (a client that failed to start still holds its connections).
        await self._consumer.stop()
        await self._admin.close()

    async def __call__(self) -> dict[int, int] | None:
        try:
            # The partitions from metadata each time: a partition added since is known at once.
            partitions = (await topic_partitions(self._admin, [self.topic]))[self.topic]
            ends = await self._consumer.end_offsets([TopicPartition(self.topic, p) for p in partitions])
        except Exception as exc:  # the broker away: the caller waits as if it had not asked
            log.debug("the end of %s unavailable: %s", self.topic, exc)
            return None
        return {tp.partition: end for tp, end in ends.items()}
