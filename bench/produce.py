"""Sending the benchmark's turns to Kafka: all at once (ingest), or at a steady rate (enrichment)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from epistream.contracts.turns import Turn
from epistream.messaging.kafka_io import create_producer, partitions_of
from epistream.settings.processes import Settings


@dataclass(frozen=True)
class Record:
    key: bytes
    value: bytes
    partition: int | None = None  # None: Kafka's partitioner picks by key, as agents' producers do

    @classmethod
    def of(cls, turn: Turn, partition: int | None = None) -> Record:
        return cls(turn.conversation_id.encode(), turn.to_bytes(), partition)


async def topic_partitions(settings: Settings) -> list[int]:
    return await partitions_of(settings, settings.topic_turns)


async def send_burst(settings: Settings, records: Sequence[Record]) -> float:
    """Send every record as fast as the producer goes; return the seconds until all are acked."""
    producer = create_producer(settings)
    await producer.start()
    try:
        started = time.perf_counter()
        pending = []
        for r in records:
            pending.append(await producer.send(settings.topic_turns, key=r.key, value=r.value, partition=r.partition))
            if len(pending) >= 1000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return time.perf_counter() - started
    finally:
        await producer.stop()


async def send_one_by_one(settings: Settings, records: Sequence[Record]) -> None:
    """Each record acked before the next is sent."""
    producer = create_producer(settings)
    await producer.start()
    try:
        for r in records:
            await producer.send_and_wait(settings.topic_turns, key=r.key, value=r.value, partition=r.partition)
    finally:
        await producer.stop()


@dataclass(frozen=True)
class SteadySend:
    records: int
    rate_per_s: float  # asked for
    seconds: float  # first send -> last ack
    max_behind_s: float  # worst lateness against the schedule: large means the producer, not the rate, set the pace

    @property
    def achieved_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")


async def send_steady(settings: Settings, records: Sequence[Record], rate_per_s: float) -> SteadySend:
    """Send record i at start + i / rate, without waiting for acks in between.

    The Kafka timestamp (produced_at) is taken at send time, so every latency
    is measured from when the turn was "said", not from when a queue let it go.
    """
    producer = create_producer(settings)
    await producer.start()
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        pending = []
        behind = 0.0
        for i, r in enumerate(records):
            delay = started + i / rate_per_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                behind = max(behind, -delay)
            pending.append(await producer.send(settings.topic_turns, key=r.key, value=r.value, partition=r.partition))
        await asyncio.gather(*pending)
        return SteadySend(len(records), rate_per_s, loop.time() - started, behind)
    finally:
        await producer.stop()
