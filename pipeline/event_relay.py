"""The memory-event relay: sends the outbox's unpublished events (sql/020) to Kafka in their order and
marks each published only after the broker acknowledged it, so an event is never sent before its
change committed (it is written in that transaction) and never lost (a failed send leaves it, and
every later one, for the next round). Delivery is at least once: a crash between the ack and the mark
sends it again, with the same event id.

One relay serves both workers that write events: the ingest worker and the enrich worker each run one
(woken after their own commits, so an event waits milliseconds, and every `events_relay_every_s` for
what others wrote: a CLI forget, a crashed worker's rows). A PostgreSQL advisory lock lets one relay
publish at a time across all processes, so two never interleave their sends of the same rows."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from itertools import groupby, takewhile

from aiokafka import AIOKafkaProducer
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from epistream.core.claims import ClaimCheck
from epistream.core.metrics import Metrics
from epistream.messaging.kafka_io import TopicDirectory, create_admin, create_producer
from epistream.messaging.tenant_topics import events_topic_for
from epistream.settings.processes import Settings
from epistream.storage.db import tenant_scope

from . import housekeeping
from .store import events

log = logging.getLogger(__name__)

#: Hands (topic, key, value) to the producer and returns its delivery: an awaitable that completes once the
#: broker acknowledged it, or raises if it never does.
Enqueue = Callable[[str, bytes, bytes], Awaitable[Awaitable[object]]]

# One key for every relay of a database ("evnt"), session-level: held across the round's transactions.
_LOCK_KEY = 0x6576_6E74
TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"
UNLOCK = "SELECT pg_advisory_unlock(%s)"
BATCH = 500
PRUNE_EVERY_S = 60.0
# The producer fails a send the broker did not acknowledge within its request timeout (40 s); a delivery
# still open well past that belongs to a producer that will not recover: the round gives up on it, so
# the lock and the connection are never held for good, and the next round starts a new producer.
DELIVERY_TIMEOUT_S = 60.0


class EventRelay:
    """A worker's relay. `pool_of` gives the worker's pool once its resources are open (None before)."""

    def __init__(self, settings: Settings, pool_of: Callable[[], AsyncConnectionPool | None], metrics: Metrics,
                 *, enqueue: Enqueue | None = None, topic_exists: Callable[[str], Awaitable[bool]] | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._pool_of = pool_of
        self._enqueue = enqueue or self._enqueue_with_producer
        self._own_topics = ClaimCheck.from_settings(settings).enforced
        self._topics = TopicDirectory(self._list_topics)
        self._topic_exists = topic_exists or self._topics.exists
        self._producer: AIOKafkaProducer | None = None
        self._wake = asyncio.Event()
        self._pruned_at = 0.0
        self.delivery_timeout_s = DELIVERY_TIMEOUT_S

    def wake(self) -> None:
        """Something was committed with events: relay them now rather than at the next tick."""
        self._wake.set()

    async def run(self) -> None:
        """Relay rounds until cancelled; a failed round is logged and counted, and the next one retries."""
        try:
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.settings.events_relay_every_s)
                except TimeoutError:
                    pass
                self._wake.clear()
                await housekeeping.guarded("event_relay", self.round, self.metrics)
                if time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
                    await housekeeping.guarded("event_prune", self.prune, self.metrics)
        finally:
            await self.close()

    async def round(self) -> int:
        """Publish what is unpublished, oldest first; return how many were. Another relay holding the
        lock: nothing (it is publishing them)."""
        pool = self._pool_of()
        if pool is None:
            return 0
        async with pool.connection() as conn:
            async with conn.transaction():
                row = await (await conn.execute(TRY_LOCK, (_LOCK_KEY,))).fetchone()
            if row is None or not row[0]:
                return 0
            try:
                return await self._publish(conn)
            finally:
                await _unlock(conn)

    async def _publish(self, conn: AsyncConnection) -> int:
        published = 0
        skipped: set[str] = set()  # tenants without their topic yet: the rest is not held up behind them
        while True:
            async with conn.transaction():
                pending = await events.unpublished(conn, BATCH, sorted(skipped))
            newly_skipped = False
            for tenant, run in groupby(pending, key=lambda p: p[0]):
                if tenant in skipped:
                    continue
                topic = events_topic_for(self.settings, tenant, own=self._own_topics)
                if self._own_topics and not await self._topic_exists(topic):
                    # Its events wait in the outbox until the tenant is onboarded (`epistream tenant add`).
                    log.warning("tenant %r has no events topic %r yet: its events wait", tenant, topic)
                    skipped.add(tenant)
                    newly_skipped = True
                    continue
                async with tenant_scope(conn, tenant):
                    rows = await events.load(conn, tenant, [seq for _, seq in run])
                published += await self._deliver(conn, tenant, topic, rows)
            if len(pending) < BATCH and not newly_skipped:
                return published

    async def _deliver(self, conn: AsyncConnection, tenant: str, topic: str, rows: list[tuple[int, str, dict]]) -> int:
        """Send the rows (in order: the producer is idempotent, so one partition keeps their order), then
        mark published those the broker acknowledged, up to the first it did not (raised after the marks)."""
        deliveries = [asyncio.ensure_future(
            await self._enqueue(topic, key.encode(), json.dumps(payload, separators=(",", ":")).encode()))
            for _, key, payload in rows]
        outcomes = await _settled(deliveries, self.delivery_timeout_s)
        acked = list(takewhile(lambda pair: not isinstance(pair[1], BaseException), zip(rows, outcomes, strict=True)))
        if acked:
            async with tenant_scope(conn, tenant):
                await events.mark_published(conn, tenant, [row[0] for row, _ in acked])
            for (_, _, payload), _ in acked:
                self.metrics.memory_events_published.labels(str(payload.get("kind"))).inc()
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:
            self._topics.invalidate()  # the topic may be gone (a tenant removed): looked up again next round
            if isinstance(failed, TimeoutError):
                await self.close()  # a producer that stopped delivering: the next round starts a new one
            raise failed
        return len(acked)

    async def prune(self) -> int:
        pool = self._pool_of()
        if pool is None:
            return 0
        async with pool.connection() as conn, conn.transaction():
            pruned = await events.prune(conn, self.settings.events_keep_s)
        self._pruned_at = time.monotonic()
        return pruned

    async def _enqueue_with_producer(self, topic: str, key: bytes, value: bytes) -> Awaitable[object]:
        if self._producer is None:
            producer = create_producer(self.settings)
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        return await self._producer.send(topic, key=key, value=value)

    async def _list_topics(self) -> set[str]:
        admin = create_admin(self.settings)
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    async def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()


async def _unlock(conn: AsyncConnection) -> None:
    """Release the session's relay lock. If that fails (the connection broke, the round was cancelled
    mid-call), the connection is closed instead: a pooled connection must never go back holding the
    lock, or every relay would wait for it for as long as the pool keeps it."""
    try:
        async with conn.transaction():
            await conn.execute(UNLOCK, (_LOCK_KEY,))
    except BaseException:
        await conn.close()  # the session ends, and its lock with it; the pool discards a closed connection
        raise


async def _settled(deliveries: Sequence[asyncio.Future[object]], timeout_s: float) -> list[object]:
    """Each delivery's result or exception, in order; one still open after `timeout_s` is cancelled and
    reads as a TimeoutError."""
    if not deliveries:
        return []
    _, still_open = await asyncio.wait(deliveries, timeout=timeout_s)
    for delivery in still_open:
        delivery.cancel()
    return [TimeoutError(f"no acknowledgement within {timeout_s:.0f}s") if d in still_open
            else (d.exception() or d.result()) for d in deliveries]

