"""A small Kafka client for agents and the CLI: produce turns, ask and await answers, read context."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import RecordMetadata

from epistream.contracts.decoding import decode, validated
from epistream.contracts.events import MemoryEvent
from epistream.contracts.positions import Position
from epistream.contracts.questions import CONTEXT_BUDGET_DEFAULT, Mode, Question
from epistream.contracts.replies import Answer, MemoryContext
from epistream.contracts.turns import ForgetRecord, Turn
from epistream.core import tracing
from epistream.core.claims import ClaimCheck, signed_headers
from epistream.errors import PermanentError, ReplyTimeout
from epistream.messaging.erasure import publish_forgotten
from epistream.messaging.kafka_io import create_consumer, create_producer, partitions_of
from epistream.messaging.tenant_topics import events_topic_for, tenant_reply_topic
from epistream.settings.processes import ClientSettings

log = logging.getLogger(__name__)

__all__ = [
    "After", "EventBatch", "EventCursorError", "ask", "claim_headers", "context", "events", "events_after",
    "events_topic", "forget", "produce_raw", "produce_turns",
]


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


#: What the caller may pass as `after`: positions, or produce_turns' map of them.
After = Iterable[Position] | Mapping[str, Position]


def _note_position(positions: dict[str, Position], key: bytes | None, meta: RecordMetadata) -> None:
    """Keep, per conversation (a turn's key), the position of its last record the broker acknowledged."""
    try:
        conversation = key.decode() if key is not None else None
        if conversation is None or (conversation in positions and positions[conversation].offset >= meta.offset):
            return
        positions[conversation] = Position(conversation_id=conversation, partition=meta.partition, offset=meta.offset)
    except ValueError:  # a key that is no conversation id (not UTF-8, too long): nothing to wait for
        return


async def produce_raw(
    settings: ClientSettings, records: Iterable[tuple[bytes | None, bytes]], *, topic: str | None = None, progress=None,
    tenant_key: bytes | None = None, positions: dict[str, Position] | None = None,
) -> int:
    """Send (key, value) pairs to `memory.turns` (or `topic`), each signed for its tenant (see
    `claim_headers`); return how many were sent. With `positions`, fill it with each conversation's
    (key's) last acknowledged position, what a read's `after` waits for."""
    check = ClaimCheck.from_settings(settings)  # once per call, not per record
    destination = topic or settings.topic_turns
    producer = create_producer(settings)
    await _start(producer)
    sent = 0
    pending: list[tuple[bytes | None, asyncio.Future[RecordMetadata]]] = []

    async def delivered() -> None:
        metas = await asyncio.gather(*(future for _, future in pending))
        if positions is not None:
            for (key, _), meta in zip(pending, metas, strict=True):
                _note_position(positions, key, meta)
        pending.clear()

    # One send span for the call (a batch send, in the messaging conventions): every record carries its
    # context, or the caller's own span's where tracing is off here; no header at all without either.
    with tracing.span(f"send {destination}", kind="producer",
                      attributes=tracing.messaging("send", "send", destination)) as current:
        trace_headers = tracing.inject()
        try:
            for key, value in records:
                pending.append((key, await producer.send(destination, key=key, value=value,
                                                         headers=claim_headers(check, value, tenant_key)
                                                         + trace_headers)))
                sent += 1
                if progress is not None:
                    progress.update(1)
                if len(pending) >= 1000:
                    await delivered()
            await delivered()
        finally:
            await producer.stop()
        tracing.set_attributes(current, {"messaging.batch.message_count": sent})
    return sent


async def produce_turns(settings: ClientSettings, turns: Iterable[Turn], *,
                        tenant_key: bytes | None = None) -> dict[str, Position]:
    """Send turns to `memory.turns`, keyed by conversation and signed for their tenant; return, per
    conversation, the position of its last turn (pass them as a read's `after` to read your writes)."""
    positions: dict[str, Position] = {}
    await produce_raw(settings, ((t.conversation_id.encode(), t.to_bytes()) for t in turns), tenant_key=tenant_key,
                      positions=positions)
    return positions


def _positions(after: After | None) -> list[Position] | None:
    if after is None:
        return None
    return list(after.values()) if isinstance(after, Mapping) else list(after)


async def ask(settings: ClientSettings, question: Question, *, timeout_s: float = 300.0,
              tenant_key: bytes | None = None, after: After | None = None) -> Answer:
    """Produce a question (signed for its tenant, see `claim_headers`) and wait for its answer on the reply
    topic; with `after` (positions from produce_turns), answered only from memory stored through them, or
    marked `incomplete`."""
    if after is not None:
        question = validated(Question, what="question", **(question.model_dump(exclude_none=True)
                                                              | {"after": _positions(after)}))
    return decode(await _request(settings, question, timeout_s, tenant_key), Answer, what="answer")


async def context(
    settings: ClientSettings, *, tenant: str, question: str, budget_tokens: int = CONTEXT_BUDGET_DEFAULT,
    since: datetime | None = None, until: datetime | None = None, conversation_ids: list[str] | None = None,
    asked_at: datetime | None = None, reply_topic: str | None = None, timeout_s: float = 30.0,
    tenant_key: bytes | None = None, after: After | None = None, listing: Literal["timeline", "facts"] | None = None,
) -> MemoryContext:
    """The best memory for ``question`` within ``budget_tokens``, for the caller's own model (no model
    call): a `context` question through memory.questions, its MemoryContext from the reply topic.
    ``since``/``until``: only memory of [since, until); ``asked_at`` (default now) anchors "last week";
    ``after`` (positions from produce_turns): read once ingest stored through them, else marked `incomplete`;
    ``listing``: instead, the one conversation's gists in time order ("timeline") or current facts."""
    request = validated(
        Question, what="context request",
        question_id=f"c-{uuid.uuid4()}", tenant=tenant, question=question, conversation_ids=conversation_ids,
        asked_at=asked_at or datetime.now(UTC), mode=Mode.CONTEXT, reply_topic=reply_topic,
        budget_tokens=budget_tokens,
        time_range=None if since is None and until is None else {"start": since, "end": until},
        after=_positions(after), listing=listing,
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
        with tracing.span(f"send {settings.topic_questions}", kind="producer",
                          attributes=tracing.messaging("send", "send", settings.topic_questions)):
            await producer.send_and_wait(settings.topic_questions, key=question.question_id.encode(), value=value,
                                         headers=tracing.inject(claim_headers(check, value, tenant_key)))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    if record.key == question.question_id.encode() and record.value is not None:
                        return record.value
        raise ReplyTimeout(f"no reply to {question.question_id} within {timeout_s:.0f}s")
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


def events_topic(settings: ClientSettings, tenant: str, tenant_key: bytes | None = None) -> str:
    """Where `tenant`'s events are read: its own topic where claims are checked (a backend with its
    `tenant_key`), else the shared one."""
    return events_topic_for(settings, tenant, own=tenant_key is not None or ClaimCheck.from_settings(settings).enforced)


@asynccontextmanager
async def _events_consumer(settings: ClientSettings, tenant: str,
                           tenant_key: bytes | None) -> AsyncIterator[tuple[AIOKafkaConsumer, list[TopicPartition]]]:
    """A consumer assigned every partition of `tenant`'s events topic (`events_topic`)."""
    topic = events_topic(settings, tenant, tenant_key)
    consumer = create_consumer(settings, enable_auto_commit=False, group_id=None)
    await _start(consumer)
    try:
        partitions = [TopicPartition(topic, p) for p in await partitions_of(settings, topic)]
        consumer.assign(partitions)
        yield consumer, partitions
    finally:
        await consumer.stop()


def _tenant_event(value: bytes | None, tenant: str) -> MemoryEvent | None:
    """The event in a record of the events topic, if it is `tenant`'s (the shared topic carries every tenant's).
    A record that is no event is passed with a warning: raising would stop every reader at it for good."""
    try:
        event = MemoryEvent.from_bytes(value)
    except ValueError as exc:  # pydantic's ValidationError is one
        log.warning("not a memory event, passed: %s", str(exc)[:200])
        return None
    return event if event.tenant == tenant else None


async def events(settings: ClientSettings, *, tenant: str, from_beginning: bool = False,
                 tenant_key: bytes | None = None) -> AsyncIterator[MemoryEvent]:
    """Tenant `tenant`'s memory events (docs/events.md) as they come, from now on (or from the oldest the
    topic keeps): its own events topic where claims are checked (a backend with its `tenant_key`), else
    the shared one, filtered to the tenant. Delivery is at least once: drop an `event_id` seen before."""
    async with _events_consumer(settings, tenant, tenant_key) as (consumer, partitions):
        if from_beginning:
            await consumer.seek_to_beginning(*partitions)
        else:
            await consumer.seek_to_end(*partitions)
        for tp in partitions:
            await consumer.position(tp)  # the start is fixed here, before the first event is awaited
        while True:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    if (event := _tenant_event(record.value, tenant)) is not None:
                        yield event


class EventCursorError(PermanentError, ValueError):
    """Offsets that cannot be read from on the tenant's events topic, with the reason."""


@dataclass(frozen=True)
class EventBatch:
    """What `events_after` read: the tenant's events in partition order, the offset to read next in each
    partition of the events topic, and whether events the topic no longer keeps were skipped."""

    events: list[MemoryEvent]
    next_offsets: dict[int, int]
    expired: bool = False


async def _start_at(consumer: AIOKafkaConsumer, partitions: list[TopicPartition],
                    after: Mapping[int, int] | None) -> tuple[dict[int, int], bool]:
    """Seek each partition to where `after` says (None: the end, so from now on; a partition it does not
    name, one added since: its start); return the start offsets and whether some were already expired."""
    first = await consumer.beginning_offsets(partitions)
    end = await consumer.end_offsets(partitions)
    if after is not None and (unknown := sorted(set(after) - {tp.partition for tp in partitions})):
        raise EventCursorError(f"the events topic has no partition {unknown[0]}")
    start: dict[int, int] = {}
    expired = False
    for tp in partitions:
        wanted = end[tp] if after is None else after.get(tp.partition, first[tp])
        if wanted > end[tp]:
            raise EventCursorError(f"offset {wanted} of partition {tp.partition} is past the end of the events "
                                   f"topic ({end[tp]}): was it made again?")
        expired = expired or wanted < first[tp]  # retention deleted events after the cursor
        start[tp.partition] = max(wanted, first[tp])
        consumer.seek(tp, start[tp.partition])
    return start, expired


async def events_after(settings: ClientSettings, *, tenant: str, after: Mapping[int, int] | None,
                       wait_s: float, limit: int, tenant_key: bytes | None = None,
                       catch_up_s: float = 5.0) -> EventBatch:
    """At most `limit` of `tenant`'s events after the offsets `after` (partition -> next offset to read;
    None: from now on) and where to read next: what the topic held at the call, else what arrives within
    `wait_s` (it returns once some came). The next offsets pass exactly the records read, so a batch cut
    at `limit` loses nothing; reading what was there is cut only after `wait_s` + `catch_up_s`."""
    async with _events_consumer(settings, tenant, tenant_key) as (consumer, partitions):
        next_offsets, expired = await _start_at(consumer, partitions, after)
        end = await consumer.end_offsets(partitions)
        found: list[MemoryEvent] = []
        deadline = time.monotonic() + wait_s
        while len(found) < limit:
            caught_up = all(next_offsets[tp.partition] >= end[tp] for tp in partitions)
            now = time.monotonic()
            if (caught_up and (found or now >= deadline)) or now >= deadline + catch_up_s:
                break
            wait = 500 if not caught_up else min(500, max(1, int((deadline - now) * 1000)))
            batches = await consumer.getmany(*partitions, timeout_ms=wait, max_records=limit - len(found))
            for tp, records in batches.items():
                for record in records:
                    if (event := _tenant_event(record.value, tenant)) is not None:
                        found.append(event)
                    next_offsets[tp.partition] = record.offset + 1  # another tenant's: passed, not returned
    return EventBatch(found, next_offsets, expired)
