"""The ingest agent's acknowledgement rule, owned by one object: a batch's records are acknowledged
only after each is stored or dead-lettered with its reason (and the segments it closed are in the
outbox, published or not).

Faust's ``take_events`` acks a batch in its ``finally``, so an exception or a cancel (SIGTERM)
inside the agent body used to commit records that were neither stored nor dead-lettered. The
agent takes batches with ``noack_take`` and hands them to :meth:`Checkpoint.store_then_ack`:
anything raised or cancelled before the end leaves the whole batch unacknowledged, to be read again.
(Named after quix-streams' ``Checkpoint``, which holds the same "write, then commit" rule.)"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Generic, TypeVar

from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.core.retry import BLOCKING, Backoff, retry
from epistream.messaging.dead_letters import DEFAULT_MAX_REQUEST_SIZE, DeadLetterSend, dead_letter

from .ingest import STAGE, IngestResult, Rejected
from .records import RawRecord

log = logging.getLogger(__name__)

E = TypeVar("E")

#: Stores a batch (turns, segmenter, watermark, in partition order) and says what it set aside and closed.
StoreBatch = Callable[[Sequence[RawRecord]], Awaitable[IngestResult]]
#: Sends closed segments (tenant, segment id) from the outbox; what it cannot send stays there.
PublishClosed = Callable[[list[tuple[str, str]]], Awaitable[object]]
#: Acknowledges one event to the consumer (Faust's ``Stream.ack``): its offset may be committed after.
Acknowledge = Callable[[E], Awaitable[object]]


@dataclass(frozen=True)
class Checkpoint(Generic[E]):
    """What a batch of events `E` needs between arriving and being acknowledged, each step injected.

    `send_dead` must return only once the letter is delivered: the event is acknowledged right after."""

    to_record: Callable[[E], RawRecord]
    store: StoreBatch
    send_dead: DeadLetterSend
    publish: PublishClosed
    ack: Acknowledge[E]
    metrics: Metrics
    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE
    #: How long a letter the broker cannot take yet is retried: until it can (the partition waits).
    backoff: Backoff = BLOCKING

    async def store_then_ack(self, events: Sequence[E]) -> None:
        """Store the batch, dead-letter what it set aside, publish what it closed, then ack every event.
        Nothing is acknowledged if any step before the acks raises or is cancelled."""
        records = [self.to_record(e) for e in events]
        with _process_span(records):
            result = await self.store(records)
            await self.dead_letter(result.dead)
            await self.publish_closed(result)
            await self.acknowledge(events)

    async def dead_letter(self, rejected: Sequence[Rejected]) -> None:
        """Each record set aside goes to the dead-letter topic with its reason, in order; a letter the
        broker cannot take yet is retried (`backoff`) before the next, and before any ack."""
        for one in rejected:
            async def send_letter(one: Rejected = one) -> None:
                await dead_letter(self.send_dead, self.metrics, one.record, stage=STAGE, error=one.error,
                                  max_request_size=self.max_request_size)

            await retry(send_letter, backoff=self.backoff, on_retry=_waiting)

    async def publish_closed(self, result: IngestResult) -> None:
        if result.closed_segments:
            # Stored in the outbox already: a failed publish is the outbox's to repeat, never a reason to re-read.
            with tracing.publishing(result.origins):
                await self.publish(result.closed_segments)

    async def acknowledge(self, events: Sequence[E]) -> None:
        for event in events:
            await self.ack(event)


def _process_span(records: Sequence[RawRecord]) -> AbstractContextManager[object]:
    """The batch's process span, as the messaging conventions have batch processing: no parent, a link
    to each record's producer span (a batch holds records of many traces), and its partition when it
    has one only."""
    if not tracing.enabled() or not records:
        return nullcontext()
    links = []
    for record in records:
        parent = tracing.extract(record.headers)
        if parent is not None:
            links.append(tracing.link(parent, tracing.messaging("process", "process", record.topic,
                                                                partition=record.partition, offset=record.offset)))
    first = records[0]
    one_partition = all(r.partition == first.partition for r in records)
    attributes = tracing.messaging("process", "process", first.topic, count=len(records),
                                   partition=first.partition if one_partition else None)
    return tracing.span(f"process {first.topic}", kind="consumer", attributes=attributes, links=links)


def _waiting(exc: BaseException, attempt: int, delay: float) -> None:
    log.warning("dead letter not delivered (%s), retry %d in %.1fs", type(exc).__name__, attempt, delay)
