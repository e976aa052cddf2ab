"""A small Kafka client for agents and the CLI: produce turns, ask and await answers, read context, forget,
follow memory events. The calls that produce or ask are one-shot wrappers over `EpistreamClient`
(epistream/client/session.py), which a process that makes many keeps instead; the events calls read
a topic of their own and stay one-shot."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from epistream.contracts.events import MemoryEvent
from epistream.contracts.positions import Position
from epistream.contracts.questions import CONTEXT_BUDGET_DEFAULT, Question
from epistream.contracts.replies import Answer, MemoryContext
from epistream.contracts.turns import ForgetRecord, Turn
from epistream.core.claims import ClaimCheck
from epistream.errors import PermanentError
from epistream.messaging.kafka_io import create_consumer, partitions_of
from epistream.messaging.tenant_topics import events_topic_for
from epistream.settings.processes import ClientSettings

from .replies import ClientClosed
from .session import After, EpistreamClient, OnProgress, claim_headers, start_client

log = logging.getLogger(__name__)

__all__ = [
    "After", "ClientClosed", "EpistreamClient", "EventBatch", "EventCursorError", "ask", "claim_headers", "context",
    "events", "events_after", "events_topic", "follow_events", "forget", "produce_raw", "produce_turns",
]


async def produce_raw(
    settings: ClientSettings, records: Iterable[tuple[bytes | None, bytes]], *, topic: str | None = None, progress=None,
    tenant_key: bytes | None = None, positions: dict[str, Position] | None = None,
) -> int:
    """Send (key, value) pairs to `memory.turns` (or `topic`), each signed for its tenant (see
    `claim_headers`); return how many were sent. With `positions`, fill it with each conversation's
    (key's) last acknowledged position, what a read's `after` waits for. One call: `EpistreamClient`
    keeps its producer for many."""
    async with EpistreamClient(settings) as client:
        return await client.produce_raw(records, topic=topic, progress=progress, tenant_key=tenant_key,
                                        positions=positions)


async def produce_turns(settings: ClientSettings, turns: Iterable[Turn], *,
                        tenant_key: bytes | None = None) -> dict[str, Position]:
    """Send turns to `memory.turns`, keyed by conversation and signed for their tenant; return, per
    conversation, the position of its last turn (pass them as a read's `after` to read your writes)."""
    async with EpistreamClient(settings) as client:
        return await client.produce_turns(turns, tenant_key=tenant_key)


async def ask(settings: ClientSettings, question: Question, *, timeout_s: float = 300.0,
              tenant_key: bytes | None = None, after: After | None = None,
              on_progress: OnProgress | None = None) -> Answer:
    """Produce a question (signed for its tenant, see `claim_headers`) and wait for its answer on the reply
    topic; with `after` (positions from produce_turns), answered only from memory stored through them, or
    marked `incomplete`; with `on_progress`, each step of answering handed over before the answer
    (`EpistreamClient.ask`). One call: `EpistreamClient` keeps its Kafka clients for many."""
    async with EpistreamClient(settings) as client:
        return await client.ask(question, timeout_s=timeout_s, tenant_key=tenant_key, after=after,
                                on_progress=on_progress)


async def context(
    settings: ClientSettings, *, tenant: str, question: str, budget_tokens: int = CONTEXT_BUDGET_DEFAULT,
    since: datetime | None = None, until: datetime | None = None, conversation_ids: list[str] | None = None,
    asked_at: datetime | None = None, reply_topic: str | None = None, timeout_s: float = 30.0,
    tenant_key: bytes | None = None, after: After | None = None, listing: Literal["timeline", "facts"] | None = None,
) -> MemoryContext:
    """The best memory for ``question`` within ``budget_tokens``, for the caller's own model (no model
    call); the keywords are `EpistreamClient.context`'s. One call: the client keeps its Kafka clients for many."""
    async with EpistreamClient(settings) as client:
        return await client.context(
            tenant=tenant, question=question, budget_tokens=budget_tokens, since=since, until=until,
            conversation_ids=conversation_ids, asked_at=asked_at, reply_topic=reply_topic, timeout_s=timeout_s,
            tenant_key=tenant_key, after=after, listing=listing)


async def forget(settings: ClientSettings, *, tenant: str, conversation_id: str | None = None) -> ForgetRecord:
    """Forget a conversation (None: every conversation of the tenant) through Kafka; see
    `EpistreamClient.forget`. Returns the record written."""
    async with EpistreamClient(settings) as client:
        return await client.forget(tenant=tenant, conversation_id=conversation_id)


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
    await start_client(consumer)
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
    async for batch in follow_events(settings, tenant=tenant, after={} if from_beginning else None,
                                     tenant_key=tenant_key):
        for event in batch.events:
            yield event


async def follow_events(settings: ClientSettings, *, tenant: str, after: Mapping[int, int] | None,
                        tenant_key: bytes | None = None, limit: int = 1000) -> AsyncIterator[EventBatch]:
    """`tenant`'s events after the offsets `after` (as `events_after` takes them; None: from now on), batch
    by batch as they come, through one consumer for as long as the caller iterates: the first batch, empty,
    once the reader holds its place (nothing after it is missed), then each fetch that read something,
    even only other tenants' records, so `next_offsets` always says where to resume (a broken-off reader
    passes it back as `after`). An EventCursorError where `after` does not fit the topic."""
    async with _events_consumer(settings, tenant, tenant_key) as (consumer, partitions):
        next_offsets, expired = await _start_at(consumer, partitions, after)
        yield EventBatch([], dict(next_offsets), expired)
        while True:
            fetched = await consumer.getmany(*partitions, timeout_ms=500, max_records=limit)
            if fetched:
                yield EventBatch(_take(fetched, tenant, next_offsets), dict(next_offsets))


def _take(fetched: Mapping[TopicPartition, list[ConsumerRecord]], tenant: str,
          next_offsets: dict[int, int]) -> list[MemoryEvent]:
    """`tenant`'s events among the records fetched, `next_offsets` moved past every record (another
    tenant's, or one that is no event, is passed, not returned)."""
    found: list[MemoryEvent] = []
    for tp, records in fetched.items():
        for record in records:
            if (event := _tenant_event(record.value, tenant)) is not None:
                found.append(event)
            next_offsets[tp.partition] = record.offset + 1
    return found


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
            found += _take(batches, tenant, next_offsets)
    return EventBatch(found, next_offsets, expired)
