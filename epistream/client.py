"""A small Kafka client for agents and the CLI: produce turns, ask and await answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from .contracts import Answer, Question
from .kafka_io import create_producer, partitions_of
from .settings import Settings


async def _start(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    """Start a client; one that cannot reach the broker is closed before the error goes up."""
    try:
        await client.start()
    except BaseException:
        await client.stop()
        raise


async def produce_raw(
    settings: Settings, records: Iterable[tuple[bytes | None, bytes]], *, topic: str | None = None, progress=None
) -> int:
    """Send (key, value) pairs to `memory.turns` (or `topic`); return how many were sent."""
    producer = create_producer(settings)
    await _start(producer)
    sent = 0
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(topic or settings.topic_turns, key=key, value=value))
            sent += 1
            if progress is not None:
                progress.update(1)
            if len(pending) >= 1000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return sent


async def ask(settings: Settings, question: Question, *, timeout_s: float = 300.0) -> Answer:
    """Produce a question and wait for its answer on the reply topic."""
    reply_topic = question.reply_topic or settings.topic_answers
    # read_committed: an answer from an aborted transaction (its worker died or lost the question) is never seen.
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, group_id=None,
                                isolation_level="read_committed")
    await _start(consumer)
    producer = create_producer(settings)
    try:
        await _start(producer)
    except BaseException:
        await consumer.stop()
        raise
    try:
        # Position at the end of every partition *before* asking, so the answer cannot be missed.
        partitions = [TopicPartition(reply_topic, p) for p in await partitions_of(settings, reply_topic)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        for tp in partitions:
            await consumer.position(tp)
        await producer.send_and_wait(settings.topic_questions, key=question.question_id.encode(), value=question.to_bytes())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    if record.key == question.question_id.encode():
                        return Answer.from_bytes(record.value)
        raise TimeoutError(f"no answer to {question.question_id} within {timeout_s:.0f}s")
    finally:
        await producer.stop()
        await consumer.stop()
