"""Kafka plumbing shared by every process: clients built from one set of options, topics, producers, dead letters."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Required, TypedDict

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.helpers import create_ssl_context

from epistream.errors import ServiceError

if TYPE_CHECKING:  # the metrics are the workers': a client install has no prometheus-client
    from confluent_kafka.admin import AdminClient
    from faust.types.auth import CredentialsT

    from epistream.core.metrics import Metrics
from epistream.settings.processes import ClientSettings

log = logging.getLogger(__name__)


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


async def group_members(settings: ClientSettings, group: str) -> tuple[str, list[GroupMember]]:
    """The group's state (Stable, PreparingRebalance, Empty, Dead ...) and its members."""
    admin = create_admin(settings, request_timeout_ms=5_000)
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


# --- every Kafka client is built here: one set of connection options (address, SASL, TLS) ----------


def trusted_cafile(settings: ClientSettings) -> Path | None:
    """The CA the clients trust: the configured one; for the embedded broker its own; else the system's."""
    if settings.kafka_ssl_cafile is not None:
        return settings.kafka_ssl_cafile
    if settings.kafka_embedded:
        return settings.kafka_embedded_ca
    return None


def _ssl_context(settings: ClientSettings) -> ssl.SSLContext | None:
    if settings.kafka_security_protocol not in ("SSL", "SASL_SSL"):
        return None
    cafile = trusted_cafile(settings)
    return create_ssl_context(cafile=str(cafile) if cafile is not None else None)


def kafka_options(settings: ClientSettings) -> dict[str, object]:
    """The connection options every aiokafka client gets: the bootstrap servers and, when secured,
    the protocol, the SASL login and the TLS context."""
    options: dict[str, object] = {"bootstrap_servers": settings.kafka_bootstrap}
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return options
    options["security_protocol"] = protocol
    if protocol.startswith("SASL_"):
        assert settings.kafka_password is not None  # the settings refuse SASL without a login
        # aiokafka names them sasl_plain_* for the SCRAM mechanisms too.
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        options["sasl_plain_username"] = settings.kafka_username
        options["sasl_plain_password"] = settings.kafka_password.get_secret_value()
    context = _ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    return options


class FaustBrokerOptions(TypedDict, total=False):
    broker: Required[str]
    broker_credentials: CredentialsT


def faust_broker_options(settings: ClientSettings) -> FaustBrokerOptions:
    """faust.App's broker arguments: the broker URL and, when secured, its credentials."""
    import faust  # here: only the Faust workers pay for importing it

    options: FaustBrokerOptions = {"broker": f"kafka://{settings.kafka_bootstrap}"}
    protocol = settings.kafka_security_protocol
    context = _ssl_context(settings)
    if protocol.startswith("SASL_"):
        assert settings.kafka_password is not None  # the settings refuse SASL without a login
        # Faust takes SASL_SSL from the presence of the context.
        options["broker_credentials"] = faust.SASLCredentials(
            username=settings.kafka_username, password=settings.kafka_password.get_secret_value(),
            mechanism=settings.kafka_sasl_mechanism, ssl_context=context,
        )
    elif context is not None:
        options["broker_credentials"] = faust.SSLCredentials(context)
    return options


def faust_datadir(settings: ClientSettings, app_id: str) -> str:
    """A Faust app's data directory, under the home rather than the working directory (Faust's default),
    so a user's folder stays clean and a checkout's stray data folder cannot end up in a wheel. Made
    here: Faust creates only its last level."""
    datadir = settings.state_dir / "faust" / app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    return str(datadir)


def librdkafka_options(settings: ClientSettings) -> dict[str, str]:
    """The same connection options in librdkafka's names, for confluent-kafka's admin client
    (create_librdkafka_admin)."""
    options = {"bootstrap.servers": settings.kafka_bootstrap,
               "security.protocol": settings.kafka_security_protocol.lower()}
    if settings.kafka_security_protocol.startswith("SASL_"):
        assert settings.kafka_password is not None  # the settings refuse SASL without a login
        options |= {"sasl.mechanism": settings.kafka_sasl_mechanism, "sasl.username": str(settings.kafka_username),
                    "sasl.password": settings.kafka_password.get_secret_value()}
    cafile = trusted_cafile(settings)
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL") and cafile is not None:
        options["ssl.ca.location"] = str(cafile)
    return options


def create_consumer(settings: ClientSettings, *topics: str, **kwargs: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(*topics, **kafka_options(settings), **kwargs)


def create_admin(settings: ClientSettings, **kwargs: Any) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**kafka_options(settings), **kwargs)


def create_librdkafka_admin(settings: ClientSettings) -> AdminClient:
    """confluent-kafka's admin client, for what aiokafka's lacks: SCRAM logins, ACLs and
    incremental config changes. Imported here, so only the processes that administer pay for it."""
    from confluent_kafka.admin import AdminClient

    config: dict[str, str | int | float | bool] = {**librdkafka_options(settings)}
    return AdminClient(config)


async def topic_id(admin: AdminClient, topic: str, *, timeout_s: float = 10.0) -> str:
    """The broker's id of `topic` (a UUID, in Kafka's base64 text; new each time the topic is created), with a
    confluent-kafka admin client (aiokafka's metadata requests predate topic ids). Raises ServiceError when
    the broker cannot say."""
    from confluent_kafka import TopicCollection

    futures = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)
    described = await asyncio.to_thread(admin_results, futures, f"describing {topic}", timeout_s=timeout_s)
    return str(described[topic].topic_id)


def admin_results(futures: dict, what: str, *, error: type[Exception] = ServiceError,
                  tolerate: tuple[str, ...] = (), timeout_s: float = 30.0) -> dict:
    """Wait for a confluent-kafka admin call's futures; each one's result by its key. A Kafka error
    raises `error` saying what failed, unless its name is tolerated (its result is then None)."""
    from confluent_kafka import KafkaException

    results = {}
    for key, future in futures.items():
        try:
            results[key] = future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].name() not in tolerate:
                raise error(f"{what}: {exc.args[0].str()}") from exc
            results[key] = None
    return results


def create_producer(settings: ClientSettings, **kwargs: Any) -> AIOKafkaProducer:
    """An idempotent producer (acks=all: no duplicates from retries) unless kwargs say otherwise."""
    return AIOKafkaProducer(
        **{"acks": "all", "enable_idempotence": True, "linger_ms": 5, **kwargs}, **kafka_options(settings),
    )


# --- exactly once: a transaction per consumed record -----------------------------------------------
#
# aiokafka 0.14 commits consumed offsets inside a transaction with TxnOffsetCommit v0, which carries the
# group id only (no generation): a member that lost its partition would still commit. Fencing comes from
# the transactional id instead, one per consumed partition (the pre-KIP-447 pattern): whoever owns the
# partition next starts a producer with the same id, which aborts the previous owner's open transaction
# and fences it, so its late commit fails and only the new owner's answer is ever visible to
# read_committed readers.


def transactional_id(group: str, consumed: TopicPartition) -> str:
    return f"{group}.{consumed.topic}.{consumed.partition}"


class PartitionProducers:
    """The transactional producer of each consumed partition, started (fencing any previous owner)
    the first time a record of that partition is handled, stopped when the partition is gone."""

    def __init__(self, settings: ClientSettings, group: str) -> None:
        self._settings = settings
        self._group = group
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}

    async def for_partition(self, consumed: TopicPartition) -> tuple[AIOKafkaProducer, bool]:
        """The partition's producer, and whether it was just started (its owner must re-read the
        committed offset: the producer's start is what settles the previous owner's transaction)."""
        if consumed in self._producers:
            return self._producers[consumed], False
        # No linger: a transaction already carries every reply ready at its start, and a reader waits on it
        # (bench/client_latency.py measured the path 5-8 ms shorter without).
        producer = create_producer(self._settings, transactional_id=transactional_id(self._group, consumed),
                                   linger_ms=0)
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producers[consumed] = producer
        return producer, True

    async def drop(self, consumed: TopicPartition) -> None:
        producer = self._producers.pop(consumed, None)
        if producer is not None:
            try:
                await producer.stop()
            except Exception as exc:  # a fenced or broken producer: it is being discarded anyway
                log.debug("stopping the producer of %s failed: %s", consumed, exc)

    async def keep_only(self, assigned: set[TopicPartition]) -> None:
        for consumed in [tp for tp in self._producers if tp not in assigned]:
            await self.drop(consumed)

    async def close(self) -> None:
        await self.keep_only(set())


class Outgoing(NamedTuple):
    """One message of a transaction: its topic, key and value, and its partition (None: by the key's hash)."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None = None


async def publish_transaction(producer: AIOKafkaProducer, messages: list[Outgoing], *, consumed: TopicPartition,
                              next_offset: int, group: str, metadata: str = "") -> None:
    """Send ``messages`` and commit ``group``'s offset of ``consumed`` (with its ``metadata``) as one
    transaction: all of it or none.

    Any failure aborts (when the producer still can) and raises; the caller discards the producer and
    reads the record again from the committed offset."""
    async with producer.transaction():
        # All sent before any is awaited: one round trip for the batch, not one per message.
        sent = [await producer.send(m.topic, key=m.key, value=m.value, partition=m.partition) for m in messages]
        await asyncio.gather(*sent)
        await producer.send_offsets_to_transaction({consumed: (next_offset, metadata)}, group)


class TopicDirectory:
    """Which topics exist (and, given `list_partitions`, which partitions each has), from the broker's
    metadata, cached for ``max_age_s``; a name or partition not in the cache always refreshes it (a reply
    topic created a moment ago is found; a miss is rare: a dead letter)."""

    def __init__(self, list_topics: Callable[[], Awaitable[set[str]]], *, max_age_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 list_partitions: Callable[[str], Awaitable[Collection[int]]] | None = None) -> None:
        self._list_topics = list_topics
        self._list_partitions = list_partitions
        self._max_age_s = max_age_s
        self._clock = clock
        self._known: set[str] = set()
        self._refreshed_at: float | None = None
        self._partitions: dict[str, tuple[float, frozenset[int]]] = {}

    def _fresh(self, at: float | None) -> bool:
        return at is not None and self._clock() - at < self._max_age_s

    async def exists(self, name: str) -> bool:
        if not (self._fresh(self._refreshed_at) and name in self._known):
            self._known = set(await self._list_topics())
            self._refreshed_at = self._clock()
        return name in self._known

    async def has_partition(self, name: str, partition: int) -> bool:
        """Whether topic `name` has `partition` (needs `list_partitions`)."""
        assert self._list_partitions is not None, "a TopicDirectory built without list_partitions"
        at, known = self._partitions.get(name, (None, frozenset()))
        if not (self._fresh(at) and partition in known):
            known = frozenset(await self._list_partitions(name))
            self._partitions[name] = (self._clock(), known)
        return partition in known

    def invalidate(self) -> None:
        """Forget what is known (a send failed: the topic may be gone)."""
        self._refreshed_at = None
        self._partitions.clear()


async def partitions_of(settings: ClientSettings, topic: str) -> list[int]:
    """The partition numbers of a topic, from the broker's metadata."""
    admin = create_admin(settings)
    await admin.start()
    try:
        return (await topic_partitions(admin, [topic]))[topic]
    finally:
        await admin.close()


async def topic_partitions(admin: AIOKafkaAdminClient, topics: list[str]) -> dict[str, list[int]]:
    """Each topic's partition numbers, with an admin client already started (one metadata request)."""
    described = await admin.describe_topics(topics)
    return {d["topic"]: sorted(p["partition"] for p in d["partitions"]) for d in described}


#: (topic, partition) -> (the group's committed offset, the end of the log)
PartitionLag = dict[tuple[str, int], tuple[int, int]]


async def partition_lag(settings: ClientSettings, group: str, topics: list[str]) -> PartitionLag:
    """Per partition of `topics`, where `group` stands (its committed offset; the log's start when it
    committed none, or one retention has deleted since: the group reads from there) and the end of the log."""
    admin = create_admin(settings)
    consumer = create_consumer(settings, group_id=None, enable_auto_commit=False)
    try:
        await admin.start()
        await consumer.start()
        committed = await admin.list_consumer_group_offsets(group)
        # The admin that reads the committed offsets names the partitions too: no client per topic.
        partitions = [TopicPartition(t, p) for t, numbers in (await topic_partitions(admin, topics)).items() for p in numbers]
        starts = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
    finally:
        # Both, whether or not they started (a client that failed to start still holds its connections).
        await consumer.stop()
        await admin.close()
    lag: PartitionLag = {}
    for tp, end in ends.items():
        meta = committed.get(tp)
        at = meta.offset if meta is not None and meta.offset >= 0 else 0
        lag[(tp.topic, tp.partition)] = (max(at, starts[tp]), end)
    return lag


async def records_between(settings: ClientSettings, topic: str, partition: int, first: int, end: int, *,
                          timeout_s: float = 10.0) -> bool | None:
    """Whether the log holds a record a consumer is given at offsets [first, end): True, False (the
    offsets are transaction markers, an aborted transaction's records, or gone), or None when the broker
    could not say within `timeout_s` (away, or a transaction still open there holds the stable end)."""
    tp = TopicPartition(topic, partition)
    consumer = create_consumer(settings, group_id=None, enable_auto_commit=False, isolation_level="read_committed",
                               auto_offset_reset="earliest")
    try:
        await consumer.start()
        consumer.assign([tp])
        consumer.seek(tp, first)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fetched = await consumer.getmany(tp, timeout_ms=500, max_records=1)
            if fetched.get(tp):
                return fetched[tp][0].offset < end
            if await consumer.position(tp) >= end:  # read past the range without being given a record
                return False
        return None
    except Exception as exc:
        log.warning("could not read %s[%d] at %d..%d: %s: %s", topic, partition, first, end - 1, type(exc).__name__, exc)
        return None
    finally:
        await consumer.stop()


def lag_by_topic(by_partition: PartitionLag, topics: list[str]) -> dict[str, int]:
    """Per topic, how far the committed offsets trail the end of the log (summed over partitions)."""
    lag: dict[str, int] = dict.fromkeys(topics, 0)
    for (topic, _), (done, end) in by_partition.items():
        lag[topic] += max(0, end - done)
    return lag


async def consumer_lag(settings: ClientSettings, group: str, topics: list[str]) -> dict[str, int]:
    """Per topic, how far `group`'s committed offsets trail the end of the log."""
    return lag_by_topic(await partition_lag(settings, group, topics), topics)


#: How often an unavailable consumer lag is logged (each failure is counted in epistream_task_failures_total).
LAG_WARNING_EVERY_S = 300.0
_lag_warned: dict[str, float] = {}  # group -> when its unavailable lag was last logged (monotonic)


async def report_lag(settings: ClientSettings, metrics: Metrics, group: str, topics: list[str]) -> PartitionLag | None:
    """Set `group`'s lag gauges and return its lag by partition (None when the broker could not say):
    lag is best-effort telemetry, never a reason to stop a worker."""
    try:
        by_partition = await partition_lag(settings, group, topics)
    except Exception as exc:
        # Counted every time, said at most every LAG_WARNING_EVERY_S: a login without DescribeGroup, or a
        # broker away, turns the lag off and with it the stall guard and the stale-mark check that read it.
        metrics.task_failures.labels("consumer_lag", type(exc).__name__).inc()
        now = time.monotonic()
        if now - _lag_warned.get(group, -LAG_WARNING_EVERY_S) >= LAG_WARNING_EVERY_S:
            _lag_warned[group] = now
            log.warning("consumer lag of %s unavailable (%s: %s): the stall guard and the stale-mark check wait "
                        "for it", group, type(exc).__name__, exc)
        return None
    for topic, value in lag_by_topic(by_partition, topics).items():
        metrics.consumer_lag.labels(group, topic).set(value)
    return by_partition
