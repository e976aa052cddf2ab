"""Kafka plumbing shared by every process: topics, producers, dead letters."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from .contracts import DeadLetter
from .metrics import Metrics
from .settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


#: The health topic only carries probes: an hour is plenty.
HEALTH_TOPIC_CONFIG = {"retention.ms": str(3_600_000)}


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic with its partition count, created up front (never auto-created)."""
    return [
        TopicSpec(settings.topic_turns, settings.turns_partitions),
        TopicSpec(settings.topic_segments, settings.turns_partitions),
        TopicSpec(settings.topic_questions, settings.questions_partitions),
        TopicSpec(settings.topic_answers, settings.questions_partitions),
        TopicSpec(settings.topic_dlq, 1),
        TopicSpec(settings.topic_health, 1, HEALTH_TOPIC_CONFIG),
    ]


async def ensure_topics(settings: Settings, *, timeout_s: float = 60.0) -> list[str]:
    """Create missing topics; return the names created. Retries while the broker warms up."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=10_000)
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            wanted = [t for t in topic_specs(settings) if t.name not in existing]
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


def worker_client_prefix(worker: str) -> str:
    return f"epistream-{worker}-{socket.gethostname()}-"


def worker_client_id(worker: str, *, pid: int | None = None) -> str:
    """The Kafka client id of a worker process: health checks find the process among its group's members by it."""
    return f"{worker_client_prefix(worker)}{pid if pid is not None else os.getpid()}"


@dataclass(frozen=True)
class GroupMember:
    client_id: str
    host: str
    partitions: int


async def group_members(settings: Settings, group: str) -> tuple[str, list[GroupMember]]:
    """The group's state (Stable, PreparingRebalance, Empty, Dead ...) and its members."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=5_000)
    try:
        await admin.start()
        described = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    # aiokafka returns the raw DescribeGroups response(s): one group per response here.
    for response in described:
        for _error, group_id, state, _protocol_type, _protocol, members, *_ in response.groups:
            if group_id == group:
                return state, [GroupMember(m[1], m[2], _assigned_partitions(m[-1])) for m in members]
    return "Dead", []


def _assigned_partitions(assignment: bytes) -> int:
    """How many partitions a member's consumer-protocol assignment holds (0 while none or unreadable)."""
    if not assignment:
        return 0
    try:
        return len(ConsumerProtocolMemberAssignment.decode(assignment).partitions())
    except Exception:  # a foreign protocol's bytes: membership still counts, the count is unknown
        return 0


def create_producer(settings: Settings) -> AIOKafkaProducer:
    # acks=all + idempotence: no duplicates from producer retries.
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
    )


class SourceRecord(Protocol):
    """Where a record came from and its bytes: a Faust event's message as `pipeline.records.RawRecord`,
    or an aiokafka `ConsumerRecord`, as they are."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


#: Sends one dead letter (its key, its bytes) to the dead-letter topic: a Faust topic's `send`,
#: or an aiokafka producer's `send_and_wait` bound to the topic.
DeadLetterSend = Callable[[bytes | None, bytes], Awaitable[object]]


#: The producers' request limit unless told otherwise: Faust's default (aiokafka's is 1 MiB), the smaller.
DEFAULT_MAX_REQUEST_SIZE = 1_000_000
#: A letter's Kafka key is the original key up to this size, else the key's SHA-256 (hex).
LETTER_KEY_MAX = 16_384


def letter_key(key: bytes | None) -> bytes | None:
    """The Kafka key a letter is sent with: the record's own, unless it is too big to repeat."""
    if key is None or len(key) <= LETTER_KEY_MAX:
        return key
    return hashlib.sha256(key).hexdigest().encode()


def _record_size(key: bytes | None, value: bytes) -> int:
    # The producer's own estimate, the one it checks against max_request_size.
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, [])


def _prefix_fitting(raw: bytes, room: int) -> bytes:
    """The longest prefix of `raw` whose base64 takes at most `room` characters."""
    return raw[: max(0, room) // 4 * 3]


def build_dead_letter(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    stage: str,
    error: BaseException,
    attempts: int = 1,
    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
) -> DeadLetter:
    """The letter for a record, cut to fit one message under `max_request_size`: the value (then the
    key) is shortened to a prefix, and the size and SHA-256 of the whole original are kept."""
    letter = DeadLetter(
        topic=topic,
        partition=partition,
        offset=offset,
        key_b64=DeadLetter.encode(key),
        value_b64=DeadLetter.encode(value),
        stage=stage,
        error_class=type(error).__name__,
        error_message=str(error)[:2000],
        attempts=attempts,
        failed_at=datetime.now(UTC),
        **_fingerprint("value", value),
        **_fingerprint("key", key),
    )
    sent_key = letter_key(key)
    if _record_size(sent_key, letter.to_bytes()) <= max_request_size:
        return letter
    # Too big: measure the letter without the original bytes, then give them what room is left.
    for part, raw in (("value", value), ("key", key)):
        if raw is None:
            continue
        bare = letter.model_copy(update={f"{part}_b64": "", f"{part}_truncated": True})
        room = max_request_size - _record_size(sent_key, bare.to_bytes())
        letter = bare.model_copy(update={f"{part}_b64": DeadLetter.encode(_prefix_fitting(raw, room))})
        if _record_size(sent_key, letter.to_bytes()) <= max_request_size:
            return letter
    return letter


def _fingerprint(part: str, raw: bytes | None) -> dict[str, object]:
    if raw is None:
        return {}
    return {f"{part}_size": len(raw), f"{part}_sha256": hashlib.sha256(raw).hexdigest()}


async def dead_letter(
    send: DeadLetterSend,
    metrics: Metrics,
    record: SourceRecord,
    *,
    stage: str,
    error: BaseException,
    attempts: int = 1,
    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
) -> DeadLetter:
    """The one way a record is given up on: its dead letter is built (cut to fit one message under the
    producer's `max_request_size`), counted, logged and sent (keyed as the record was, so the
    dead-letter topic keeps each key's letters together)."""
    letter = build_dead_letter(
        topic=record.topic, partition=record.partition, offset=record.offset, key=record.key, value=record.value,
        stage=stage, error=error, attempts=attempts, max_request_size=max_request_size,
    )
    metrics.dead_letters.labels(letter.stage, letter.error_class).inc()
    log.warning(
        "dead-lettered %s[%d]@%d at %s: %s", letter.topic, letter.partition, letter.offset, letter.stage, letter.error_class
    )
    await send(letter_key(record.key), letter.to_bytes())
    return letter


async def partitions_of(settings: Settings, topic: str) -> list[int]:
    """The partition numbers of a topic, from the broker's metadata."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(p["partition"] for p in described[0]["partitions"])


async def consumer_lag(settings: Settings, group: str, topics: list[str]) -> dict[str, int]:
    """Per topic, how far `group`'s committed offsets trail the end of the log."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        partitions = [TopicPartition(t, p) for t in topics for p in await partitions_of(settings, t)]
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
        await admin.close()
    lag: dict[str, int] = dict.fromkeys(topics, 0)
    for tp, end in ends.items():
        meta = committed.get(tp)
        done = meta.offset if meta is not None and meta.offset >= 0 else 0
        lag[tp.topic] += max(0, end - done)
    return lag


# --- topic administration: per-run topics, offsets, deleting records ----------------------------


async def create_topic(settings: Settings, name: str, *, partitions: int = 1, timeout_s: float = 10.0) -> None:
    """Create one topic (an existing one is fine) and wait until the broker's metadata lists its partitions."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=10_000)
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
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


async def log_offsets(settings: Settings, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition, the log's (start, end) offsets: end - start messages are held."""
    partitions = [TopicPartition(topic, p) for p in await partitions_of(settings, topic)]
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
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
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, p): RecordsToDelete(offset) for p, offset in before.items()})
    finally:
        await admin.close()
