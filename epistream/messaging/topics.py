"""Kafka topics: the ones epistream uses, created up front with their configs (retention,
compaction) and kept to them on every start; and the administration benches and tests need
(per-run topics, offsets, deleting records)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.admin import NewTopic, RecordsToDelete
from aiokafka.errors import TopicAlreadyExistsError

from epistream.messaging.kafka_io import (
    admin_results,
    create_admin,
    create_consumer,
    create_librdkafka_admin,
    partitions_of,
)
from epistream.settings.processes import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


#: The health topic only carries probes: an hour is plenty.
HEALTH_TOPIC_CONFIG = {"retention.ms": str(3_600_000)}


def retention_ms(days: float) -> str:
    """Kafka's retention.ms for a number of days (-1: forever)."""
    return "-1" if days == -1 else str(round(days * 86_400_000))


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic with its partition count and the configs epistream sets (created up front, never
    auto-created; the configs are set again on every start, so a changed retention takes effect)."""
    turns_kept = {"retention.ms": retention_ms(settings.turns_retention_days)}
    replies_kept = {"retention.ms": retention_ms(settings.topic_retention_days)}
    return [
        TopicSpec(settings.topic_turns, settings.turns_partitions, turns_kept),
        # The enrich worker's queue: kept as long as the turns, so a long enrichment outage loses nothing.
        TopicSpec(settings.topic_segments, settings.turns_partitions, turns_kept),
        TopicSpec(settings.topic_questions, settings.questions_partitions, replies_kept),
        TopicSpec(settings.topic_answers, settings.questions_partitions, replies_kept),
        TopicSpec(settings.topic_dlq, 1, {"retention.ms": retention_ms(settings.dlq_retention_days)}),
        # One record per forgotten scope for as long as the topic lives: compaction drops only a
        # scope's older copies, never the last one.
        TopicSpec(settings.topic_forgotten, 1, {"cleanup.policy": "compact", "retention.ms": "-1"}),
        TopicSpec(settings.topic_health, 1, HEALTH_TOPIC_CONFIG),
        # Keyed by conversation like the turns; kept as long as the replies (a reader catches up within it).
        TopicSpec(settings.topic_events, settings.turns_partitions, replies_kept),
    ]


def topic_configs(admin, topics: list[str]) -> dict[str, dict[str, tuple[str, bool]]]:
    """Per topic: config name -> (value, set on the topic itself). Blocking; admin: create_librdkafka_admin's."""
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    described = admin_results(admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics]),
                              f"describing the configs of {', '.join(topics)}")
    own = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    return {resource.name: {name: (entry.value, entry.source == own) for name, entry in entries.items()}
            for resource, entries in described.items()}


def drifted_configs(current: dict[str, dict[str, tuple[str, bool]]],
                    specs: list[TopicSpec]) -> dict[str, dict[str, str]]:
    """Per topic, the configs of its spec that its current configs lack or differ from."""
    drifted = {}
    for spec in specs:
        configs = current.get(spec.name, {})
        differing = {k: v for k, v in spec.config.items() if configs.get(k, ("", False))[0] != v}
        if differing:
            drifted[spec.name] = differing
    return drifted


def set_topic_configs(admin, changes: dict[str, dict[str, str]]) -> None:
    """Set these configs on these topics and nothing else (IncrementalAlterConfigs, KIP-339): an
    operator's own settings stay whatever they are by then. AlterConfigs would replace the topic's
    whole set with one built from a read, so a setting made after the read, or a read that lagged
    the broker's metadata, would be lost. Blocking; admin: create_librdkafka_admin's (aiokafka's has
    no such call)."""
    if not changes:
        return
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    resources = [ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
        for topic, configs in changes.items()]
    admin_results(admin.incremental_alter_configs(resources), f"setting the configs of {', '.join(changes)}")


def reconcile_topic_configs(settings: Settings, specs: list[TopicSpec]) -> list[str]:
    """Set each existing topic's configs to its spec where they differ; return the topics changed. Blocking."""
    wanted = [t for t in specs if t.config]
    if not wanted:
        return []
    admin = create_librdkafka_admin(settings)
    changes = drifted_configs(topic_configs(admin, [t.name for t in wanted]), wanted)
    set_topic_configs(admin, changes)
    return list(changes)


async def ensure_topics(settings: Settings, *, timeout_s: float = 60.0) -> list[str]:
    """Create missing topics; return the names created. Retries while the broker warms up."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        admin = create_admin(settings, request_timeout_ms=10_000)
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            specs = topic_specs(settings)
            wanted = [t for t in specs if t.name not in existing]
            changed = await asyncio.to_thread(reconcile_topic_configs, settings,
                                              [t for t in specs if t.name in existing])
            if changed:
                log.info("set the retention and cleanup configs of %s", ", ".join(changed))
            if wanted:
                try:
                    await admin.create_topics(
                        [NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, topic_configs=t.config)
                         for t in wanted]
                    )
                except TopicAlreadyExistsError:
                    pass  # another process won the race
            return [t.name for t in wanted]
        except Exception as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise
            log.info("waiting for Kafka to accept admin requests: %s", type(exc).__name__)
            await asyncio.sleep(1.0)
        finally:
            await admin.close()


async def create_topic(settings: Settings, name: str, *, partitions: int = 1, timeout_s: float = 10.0) -> None:
    """Create one topic (an existing one is fine) and wait until the broker's metadata lists its partitions."""
    admin = create_admin(settings, request_timeout_ms=10_000)
    await admin.start()
    try:
        try:
            await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        except TopicAlreadyExistsError:
            pass
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            described = await admin.describe_topics([name])
            if described and described[0].get("partitions"):
                return
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def delete_topics(settings: Settings, names: list[str]) -> None:
    admin = create_admin(settings, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


async def log_offsets(settings: Settings, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition, the log's (start, end) offsets: end - start messages are held."""
    partitions = [TopicPartition(topic, p) for p in await partitions_of(settings, topic)]
    consumer = create_consumer(settings, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        starts = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    return {tp.partition: (starts[tp], ends[tp]) for tp in partitions}


async def delete_records(settings: Settings, topic: str, before: dict[int, int]) -> None:
    """Delete each partition's messages below the given offset (Kafka's DeleteRecords: the log start moves up)."""
    if not before:
        return
    admin = create_admin(settings)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, p): RecordsToDelete(offset) for p, offset in before.items()})
    finally:
        await admin.close()
