"""The record of what was forgotten, in Kafka: `memory.forgotten`, a compacted topic that keeps one
record per forgotten scope (a conversation, or a whole tenant) for as long as the topic lives.

PostgreSQL's tombstones keep a replay of `memory.turns` from restoring a forgotten conversation,
but only in the database that holds them. Rebuilding the memory from Kafka into a new database is
the recovery path, so the erasure has to live beside the turns: `forget` writes here first, and
every worker reads the whole topic before it reads a turn (epistream.pipeline.erasure)."""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaProducer, TopicPartition
from pydantic import ValidationError

from epistream.contracts.turns import ForgetRecord
from epistream.messaging.kafka_io import create_consumer, partitions_of
from epistream.settings.processes import ClientSettings

log = logging.getLogger(__name__)


async def publish_forgotten(producer: AIOKafkaProducer, settings: ClientSettings, record: ForgetRecord) -> None:
    """Write the record with a started producer and wait for every in-sync replica to hold it (acks=all)."""
    await producer.send_and_wait(settings.topic_forgotten, key=record.key(), value=record.to_bytes())


def parse_forgotten(raw: bytes | None) -> ForgetRecord | None:
    """A record of the topic, or None for one that is not ours (logged: only `forget` writes here)."""
    try:
        return ForgetRecord.from_bytes(raw)
    except (ValidationError, ValueError) as exc:
        log.error("ignoring an unreadable record of the forgotten topic: %s", exc)
        return None


async def read_forgotten(settings: ClientSettings) -> list[ForgetRecord]:
    """Every record of the topic, from its start to the end it had when the read began."""
    partitions = [TopicPartition(settings.topic_forgotten, p)
                  for p in await partitions_of(settings, settings.topic_forgotten)]
    consumer = create_consumer(settings, group_id=None, enable_auto_commit=False, isolation_level="read_committed")
    await consumer.start()
    try:
        consumer.assign(partitions)
        starts, ends = await consumer.beginning_offsets(partitions), await consumer.end_offsets(partitions)
        # Positions set explicitly and followed by the records' own offsets: a compacted log has gaps.
        reached = {}
        for tp in partitions:
            consumer.seek(tp, starts[tp])
            reached[tp] = starts[tp]
        found: list[ForgetRecord] = []
        while pending := [tp for tp in partitions if reached[tp] < ends[tp]]:
            batches = await consumer.getmany(*pending, timeout_ms=1000)
            if not batches:  # nothing left to return below the end (control records, say): where are we?
                for tp in pending:
                    reached[tp] = max(reached[tp], await consumer.position(tp))
            for tp, records in batches.items():
                found += [r for r in (parse_forgotten(record.value) for record in records) if r is not None]
                if records:
                    reached[tp] = records[-1].offset + 1
        return found
    finally:
        await consumer.stop()
