"""A small Kafka client for agents and the CLI: produce turns, ask and await answers, read context."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from .claims import ClaimCheck, signed_headers
from .contracts import (
    CONTEXT_BUDGET_DEFAULT,
    Answer,
    ForgetRecord,
    MemoryContext,
    Mode,
    Question,
    decode,
    validated,
)
from .erasure import publish_forgotten
from .kafka_io import create_consumer, create_producer, partitions_of
from .replies import tenant_reply_topic
from .settings import ClientSettings


def claim_headers(check: ClaimCheck, value: bytes, tenant_key: bytes | None = None) -> list[tuple[str, bytes]]:
    """The signature proving a record's tenant claim: with `tenant_key` (a tenant's backend holds its
    own), or derived from the deployment's secret in `check` (the operator's tools hold it); none when
    neither is there, or for bytes that name no tenant (they cannot be signed for anyone)."""
    if tenant_key is not None:
        return signed_headers(tenant_key, value)
    if not check.enforced:
        return []
    try:
        tenant = json.loads(value)["tenant"]
    except (ValueError, TypeError, KeyError):
        return []
    return check.headers_for(str(tenant), value)


async def _start(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    """Start a client; one that cannot reach the broker is closed before the error goes up."""
    try:
        await client.start()
    except BaseException:
        await client.stop()
        raise


async def produce_raw(
    settings: ClientSettings, records: Iterable[tuple[bytes | None, bytes]], *, topic: str | None = None, progress=None,
    tenant_key: bytes | None = None,
) -> int:
    """Send (key, value) pairs to `memory.turns` (or `topic`), each signed for its tenant (see
    `claim_headers`); return how many were sent."""
    check = ClaimCheck.from_settings(settings)  # once per call, not per record
    producer = create_producer(settings)
    await _start(producer)
    sent = 0
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(topic or settings.topic_turns, key=key, value=value,
                                               headers=claim_headers(check, value, tenant_key)))
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


async def ask(settings: ClientSettings, question: Question, *, timeout_s: float = 300.0,
              tenant_key: bytes | None = None) -> Answer:
    """Produce a question (signed for its tenant, see `claim_headers`) and wait for its answer on the reply topic."""
    return decode(await _request(settings, question, timeout_s, tenant_key), Answer, what="answer")


async def context(
    settings: ClientSettings, *, tenant: str, question: str, budget_tokens: int = CONTEXT_BUDGET_DEFAULT,
    since: datetime | None = None, until: datetime | None = None, conversation_ids: list[str] | None = None,
    asked_at: datetime | None = None, reply_topic: str | None = None, timeout_s: float = 30.0,
    tenant_key: bytes | None = None,
) -> MemoryContext:
    """The best memory for ``question`` within ``budget_tokens``, for the caller's own model (no model
    call): a `context` question through memory.questions, its MemoryContext from the reply topic.
    ``since``/``until``: only memory of [since, until); ``asked_at`` (default now) anchors "last week"."""
    request = validated(
        Question, what="context request",
        question_id=f"c-{uuid.uuid4()}", tenant=tenant, question=question, conversation_ids=conversation_ids,
        asked_at=asked_at or datetime.now(UTC), mode=Mode.CONTEXT, reply_topic=reply_topic,
        budget_tokens=budget_tokens,
        time_range=None if since is None and until is None else {"start": since, "end": until},
    )
    return decode(await _request(settings, request, timeout_s, tenant_key), MemoryContext, what="context reply")


async def _request(settings: ClientSettings, question: Question, timeout_s: float, tenant_key: bytes | None) -> bytes:
    """Produce a question and return the value of its reply (keyed by its id) on the reply topic."""
    check = ClaimCheck.from_settings(settings)
    reply_topic = question.reply_topic or settings.topic_answers
    if question.reply_topic is None and (tenant_key is not None or check.enforced):
        reply_topic = tenant_reply_topic(settings.topic_answers, question.tenant)  # where checked claims reply
    # read_committed: an answer from an aborted transaction (its worker died or lost the question) is never seen.
    consumer = create_consumer(settings, enable_auto_commit=False, group_id=None, isolation_level="read_committed")
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
        value = question.to_bytes()
        await producer.send_and_wait(settings.topic_questions, key=question.question_id.encode(), value=value,
                                     headers=claim_headers(check, value, tenant_key))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    if record.key == question.question_id.encode() and record.value is not None:
                        return record.value
        raise TimeoutError(f"no reply to {question.question_id} within {timeout_s:.0f}s")
    finally:
        await producer.stop()
        await consumer.stop()


async def forget(settings: ClientSettings, *, tenant: str, conversation_id: str | None = None) -> ForgetRecord:
    """Forget a conversation (None: every conversation of the tenant) through Kafka: the erasure is written
    to the compacted memory.forgotten, which every ingest worker applies as it arrives and again on every
    start, so a database rebuilt from Kafka stays without it. Returns the record written; the deletion
    itself follows within the ingest worker's reading of that topic."""
    record = ForgetRecord(tenant=tenant, conversation_id=conversation_id, forgotten_at=datetime.now(UTC))
    await publish_forgotten(settings, record)
    return record
