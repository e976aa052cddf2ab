"""Sending a workload's plan at a steady rate, on its own thread, while a scenario breaks things.

Each record is acknowledged before the next is sent, so a conversation's turns reach Kafka in order
even across a broker outage: a send that fails is sent again until it is acknowledged (a client does
the same). A retried send may have reached the log the first time, so a record can be in Kafka twice;
the invariants count that as the producer's doing, never the pipeline's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError

from epistream.messaging.kafka_io import create_producer
from epistream.settings.processes import Settings

from .workload import Item, Workload

#: How long one record may keep failing before the stream gives up (longer than any scenario's outage).
GIVE_UP_S = 900.0


@dataclass
class StreamLog:
    sent: int = 0
    retries: int = 0
    #: plan indexes whose first send failed: the record may be in Kafka more than once
    resent: set[int] = field(default_factory=set)
    started_at: float | None = None
    finished_at: float | None = None
    error: BaseException | None = None


class Stream(threading.Thread):
    """The producer of one scenario; `log.sent` tells the scenario how far the stream got."""

    def __init__(self, settings: Settings, workload: Workload, rate_per_s: float) -> None:
        super().__init__(name="faults-stream", daemon=True)
        self.settings, self.workload, self.rate = settings, workload, rate_per_s
        self.log = StreamLog()
        self._topics = {"turns": settings.topic_turns, "questions": settings.topic_questions}

    @property
    def progress(self) -> float:
        return self.log.sent / max(1, len(self.workload.plan))

    def run(self) -> None:
        try:
            asyncio.run(self._send_all())
        except BaseException as exc:  # reported by the scenario runner
            self.log.error = exc

    async def _send_all(self) -> None:
        self.log.started_at = time.monotonic()
        producer = await self._producer()
        try:
            for index, item in enumerate(self.workload.plan):
                due = self.log.started_at + index / self.rate
                if (delay := due - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                producer = await self._send(producer, index, item)
                self.log.sent += 1
        finally:
            await producer.stop()
        self.log.finished_at = time.monotonic()

    async def _producer(self):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            producer = create_producer(self.settings)
            try:
                await producer.start()
                return producer
            except KafkaError:
                await producer.stop()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)

    async def _send(self, producer, index: int, item: Item):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            try:
                await producer.send_and_wait(self._topics[item.topic], key=item.key, value=item.value)
                return producer
            except KafkaError:
                self.log.retries += 1
                self.log.resent.add(index)
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)
                # A producer whose broker went away may stay wedged: start a fresh one.
                await producer.stop()
                producer = await self._producer()

    def wait_progress(self, share: float, *, timeout_s: float = 900.0) -> None:
        """Block until this share of the plan is sent (or the stream ended)."""
        deadline = time.monotonic() + timeout_s
        while self.progress < share and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
