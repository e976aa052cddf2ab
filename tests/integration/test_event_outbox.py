"""The memory-event outbox with real PostgreSQL and Kafka: an event exists only once the transaction of
its change committed (a rolled-back forget leaves none to publish), events the relay could not
deliver while the broker was unreachable stay in the outbox, unmarked, and go out in their order once
it is back (read with kafka-python), and published ones are pruned after events_keep_s."""

from __future__ import annotations

import asyncio
import json

import pytest
from kafka import KafkaConsumer, TopicPartition

from epistream.core.metrics import Metrics
from epistream.messaging.topics import create_topic
from epistream.pipeline.event_relay import EventRelay
from epistream.pipeline.store import events
from epistream.pipeline.store.forget import forget, forgotten_event
from epistream.storage.db import tenant_scope

pytestmark = pytest.mark.integration

OUTBOX = "SELECT conversation_id, published_at IS NOT NULL FROM memory.event_outbox WHERE tenant = %s ORDER BY seq"


class _Rollback(Exception):
    pass


async def _outbox(pool, tenant: str) -> list[tuple[str, bool]]:
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT set_config('epistream.tenant', %s, true)", (tenant,))
        return [(str(r[0]), bool(r[1])) for r in await (await conn.execute(OUTBOX, (tenant,))).fetchall()]


def _read_events(bootstrap: str, topic: str, tenant: str, want: int) -> list[dict]:
    """Every event of `tenant` on the topic, from its start, in each partition's order (kafka-python)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        found = []
        for record in consumer:
            event = json.loads(record.value)
            if event["tenant"] == tenant:
                found.append(event)
            if len(found) >= want:
                break
        return found
    finally:
        consumer.close()


async def _relay_rounds(relay: EventRelay, tenant: str, pool) -> None:
    """Rounds until the tenant's outbox is all published (other tests' leftovers may come first)."""
    for _ in range(20):
        await relay.round()
        if all(published for _, published in await _outbox(pool, tenant)):
            return
    raise AssertionError("the relay left events of the tenant unpublished")


async def test_a_rolled_back_change_leaves_no_event_and_the_relay_publishes_none(kafka, pool, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    async with pool.connection() as conn:
        with pytest.raises(_Rollback):
            async with conn.transaction():
                await forget(conn, tenant, conversation)
                assert [c for c, _ in await _outbox(pool, tenant)] == []  # not visible before the commit
                raise _Rollback
    assert await _outbox(pool, tenant) == []
    settings = kafka.with_overrides(topic_events=unique("events"))
    await create_topic(settings, settings.topic_events)
    relay = EventRelay(settings, lambda: pool, Metrics.create())
    try:
        await relay.round()
    finally:
        await relay.close()
    assert await asyncio.to_thread(_read_events, settings.kafka_bootstrap, settings.topic_events, tenant, 1) == []
    # The same forget committed is announced once.
    async with pool.connection() as conn:
        await forget(conn, tenant, conversation)
        await forget(conn, tenant, conversation)  # done again: changes nothing, announces nothing
    assert await _outbox(pool, tenant) == [(conversation, False)]
    # The prune takes published events only: this one waits for its relay, however old.
    await EventRelay(kafka.with_overrides(events_keep_s=0), lambda: pool, Metrics.create()).prune()
    assert await _outbox(pool, tenant) == [(conversation, False)]


async def test_events_left_by_a_broker_outage_go_out_in_order_once_it_is_back(kafka, pool, unique):
    tenant = unique("tenant")
    conversations = [unique(f"conv{i}") for i in range(3)]
    for conversation in conversations:
        async with pool.connection() as conn:
            await forget(conn, tenant, conversation)
    settings = kafka.with_overrides(topic_events=unique("events"))
    await create_topic(settings, settings.topic_events)

    # Nothing listens there: the broker is unreachable, every send fails.
    away = EventRelay(settings.with_overrides(kafka_bootstrap="127.0.0.1:9"), lambda: pool, Metrics.create())
    try:
        with pytest.raises(Exception):  # noqa: B017 (whatever the client raises: what matters is what stays)
            await away.round()
    finally:
        await away.close()
    assert await _outbox(pool, tenant) == [(c, False) for c in conversations]

    back = EventRelay(settings, lambda: pool, Metrics.create())
    try:
        await _relay_rounds(back, tenant, pool)
    finally:
        await back.close()
    published = back.metrics.registry.get_sample_value("epistream_memory_events_published_total",
                                                        {"kind": "conversation_forgotten"})
    assert published is not None and published >= 3
    assert await _outbox(pool, tenant) == [(c, True) for c in conversations]
    events = await asyncio.to_thread(_read_events, settings.kafka_bootstrap, settings.topic_events, tenant, 3)
    assert [(e["kind"], e["conversation_id"], e["scope"]) for e in events] == [
        ("conversation_forgotten", c, "conversation") for c in conversations]
    assert len({e["event_id"] for e in events}) == 3
    # Published, they leave the outbox once older than events_keep_s: the table stays bounded.
    keeping = EventRelay(settings, lambda: pool, Metrics.create())
    await keeping.prune()
    assert len(await _outbox(pool, tenant)) == 3  # within the hour kept by default
    await EventRelay(settings.with_overrides(events_keep_s=0), lambda: pool, Metrics.create()).prune()
    assert await _outbox(pool, tenant) == []


async def _announce(conn, tenant: str, conversation: str) -> None:
    """A change's event, added as every writer adds it: at the end of its transaction, in its tenant's scope."""
    async with tenant_scope(conn, tenant):
        await events.add(conn, [forgotten_event(tenant, conversation, await events.now(conn))])


async def test_a_tenants_events_take_their_order_from_their_commits(postgres, pool, unique):
    """Two transactions announcing changes of one tenant: the second waits at its event until the first
    commits, so it takes the later seq and commits later: the relay, reading in seq order, can never meet
    a seq whose transaction is still to commit before a smaller one (issue 39). Another tenant's writer
    is not held up."""
    tenant, other = unique("tenant-a"), unique("tenant-b")
    async with pool.connection() as first, pool.connection() as second, pool.connection() as third:
        async with first.transaction():
            await _announce(first, tenant, "conv-first")  # holds the tenant's outbox lock to the commit
            later = asyncio.create_task(_announce(second, tenant, "conv-second"))
            await asyncio.wait_for(_announce(third, other, "conv-other"), timeout=10)
            await asyncio.sleep(1.0)
            assert not later.done(), "a second writer of the tenant took a seq before the first committed"
            assert await _outbox(pool, tenant) == []  # nothing of either is visible yet
        await asyncio.wait_for(later, timeout=30)
    assert await _outbox(pool, tenant) == [("conv-first", False), ("conv-second", False)]
    assert await _outbox(pool, other) == [("conv-other", False)]
