"""The ingest agent's acknowledgement rule: a batch's records are acknowledged only after each
is stored or dead-lettered (and the segments it closed are in the outbox, published or not).

Faust's ``take_events`` acks a batch in its ``finally``, so an exception or a cancel (SIGTERM)
inside the agent body used to commit records that were neither stored nor dead-lettered. The
agent takes batches with ``noack_take`` and hands them here with the stream's ``ack``: anything
raised or cancelled before the end leaves the whole batch unacknowledged, to be read again."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.core.retry import BLOCKING, Backoff, retry
from epistream.messaging.dead_letters import DEFAULT_MAX_REQUEST_SIZE, DeadLetterSend, dead_letter

from .ingest import STAGE, IngestResult, Rejected
from .records import RawRecord

log = logging.getLogger(__name__)

E = TypeVar("E")


async def settle(
    events: Sequence[E],
    *,
    to_record: Callable[[E], RawRecord],
    ingest: Callable[[Sequence[RawRecord]], Awaitable[IngestResult]],
    send_dead: DeadLetterSend,
    publish: Callable[[list[tuple[str, str]]], Awaitable[object]],
    ack: Callable[[E], Awaitable[object]],
    metrics: Metrics,
    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
    backoff: Backoff = BLOCKING,
) -> None:
    """Store the batch, dead-letter what it set aside (waiting out a broker that cannot take the
    letters yet: `send_dead` must return only once the letter is delivered), publish what it
    closed, then ack every event."""
    records = [to_record(e) for e in events]
    with _process_span(records):
        await _settle(events, records, ingest=ingest, send_dead=send_dead, publish=publish, ack=ack, metrics=metrics,
                      max_request_size=max_request_size, backoff=backoff)


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


async def _settle(events: Sequence[E], records: list[RawRecord], *,
                  ingest: Callable[[Sequence[RawRecord]], Awaitable[IngestResult]], send_dead: DeadLetterSend,
                  publish: Callable[[list[tuple[str, str]]], Awaitable[object]],
                  ack: Callable[[E], Awaitable[object]], metrics: Metrics, max_request_size: int,
                  backoff: Backoff) -> None:
    result = await ingest(records)
    for rejected in result.dead:
        async def send_letter(rejected: Rejected = rejected) -> None:
            await dead_letter(send_dead, metrics, rejected.record, stage=STAGE, error=rejected.error,
                              max_request_size=max_request_size)

        await retry(send_letter, backoff=backoff, on_retry=_waiting)
    if result.closed_segments:
        # Stored in the outbox already: a failed publish is the outbox's to repeat, never a reason to re-read.
        with tracing.publishing(result.origins):
            await publish(result.closed_segments)
    for event in events:
        await ack(event)


def _waiting(exc: BaseException, attempt: int, delay: float) -> None:
    log.warning("dead letter not delivered (%s), retry %d in %.1fs", type(exc).__name__, attempt, delay)
