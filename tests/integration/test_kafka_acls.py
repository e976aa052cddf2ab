"""Authenticated tenants on a secured broker: a second embedded broker with SASL_SSL (SCRAM over TLS,
a CA of its own, an authorizer that refuses what no ACL allows) and real ingest and answer workers
logged in as its super user. Each tenant's backend gets its login from `epistream tenant add`, then:

* it writes its own turns and asks its own questions, and hears back on its own reply topic;
* it reads its own memory events (epistream.client.api.events) and no other tenant's, nor the shared topic's;
* a turn it signs as another tenant is dead-lettered with the reason;
* it reads nothing of another tenant's replies, the shared topics or the dead letters, and produces
  nowhere but memory.turns and memory.questions (the broker refuses; the operator sees those records);
* a wrong password, or a tenant removed by `epistream tenant remove`, cannot log in."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from epistream.client.api import context, events, produce_raw
from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.events import MemoryEvent
from epistream.infra import services
from epistream.messaging.kafka_io import create_producer, librdkafka_options, partitions_of
from epistream.ops.tenants import credentials
from epistream.ops.tls import CA_FILE, embedded_tls_dir
from epistream.settings.processes import Settings
from epistream.testing.scripted_llm import ScriptedLLM

from .conftest import read_topic, wait_for
from .deployments import BASE_PORT, Deployment, as_env, deployments
from .helpers import make_turns

pytestmark = pytest.mark.integration

SECRET = "acl-test-secret-" + "y" * 32
WORKERS_LOGIN = {"kafka_username": "epistream-workers", "kafka_password": SecretStr("workers-" + uuid.uuid4().hex)}
PORT = BASE_PORT + 70  # the broker, its controller and its supervisor: beside every other test port


@pytest.fixture(scope="module")
def secured_broker(kafka: Settings) -> Iterator[Settings]:
    """An embedded SASL_SSL broker on its own home and ports; the settings log in as its super user."""
    home = kafka.state_dir / "secured-kafka"
    shutil.rmtree(home, ignore_errors=True)  # formatted afresh: the workers' SCRAM login is written at format
    home.mkdir(parents=True)
    (home / "cache").symlink_to(kafka.state_dir / "cache")  # the broker's jars, resolved once for the test stack
    overrides = {"home": home, "kafka_bootstrap": f"127.0.0.1:{PORT}", "kafka_controller_port": PORT + 1,
                 "supervisor_metrics_port": PORT + 2, "kafka_security_protocol": "SASL_SSL", **WORKERS_LOGIN}
    broker = kafka.with_overrides(**overrides)
    try:
        with pytest.MonkeyPatch.context() as env:  # the broker's supervisor reads its settings from there
            for name, value in overrides.items():
                env.setenv(f"EPISTREAM_{name.upper()}", as_env(value))
            services.up(broker, workers=False, only={"kafka"})
        # The workers and clients are not "embedded": they trust the CA they are given.
        yield broker.with_overrides(kafka_embedded=False, kafka_ssl_cafile=embedded_tls_dir(broker) / CA_FILE)
    finally:
        services.down(broker)


def _never_called(body: dict) -> tuple[int, str]:
    return 500, "the context mode makes no model call"


@pytest.fixture(scope="module")
def secured(secured_broker: Settings, kafka: Settings) -> Iterator[Deployment]:
    login = {name: getattr(secured_broker, name) for name in (
        "kafka_bootstrap", "kafka_security_protocol", "kafka_username", "kafka_password", "kafka_ssl_cafile")}
    with ScriptedLLM(_never_called) as llm, deployments(
            kafka, 1, kafka_embedded=False, tenant_key_secret=SecretStr(SECRET), llm_base_url=llm.base_url,
            **login) as made:
        yield made[0]


def _onboard(deployment: Deployment, tenant: str) -> Settings:
    """`epistream tenant add`, as the operator runs it; the settings the tenant's backend then uses."""
    done = deployment.cli("tenant", "add", tenant)
    assert done.returncode == 0, done.stderr
    printed = dict(line.split("=", 1) for line in done.stdout.splitlines() if line.startswith("EPISTREAM_"))
    creds = credentials(deployment.settings, tenant)
    assert printed["EPISTREAM_KAFKA_USERNAME"] == creds.username
    return deployment.settings.with_overrides(
        kafka_username=printed["EPISTREAM_KAFKA_USERNAME"], kafka_password=SecretStr(printed["EPISTREAM_KAFKA_PASSWORD"]),
        tenant_key_secret=None)  # a backend holds its own key, never the operator's secret


def _read_as(settings: Settings, topic: str, partitions: list[int], *, seconds: float = 3.0) -> tuple[str | None, list]:
    """What `settings`' login learns of `topic`: the broker's refusal (of its metadata, or of a fetch
    where the login may describe but not read it; None when granted), and every record it fetches from
    the beginning within `seconds` (confluent-kafka's consumer: aiokafka retries an unauthorized offset
    lookup without end instead of saying so)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import KafkaError as Signal
    from confluent_kafka import TopicPartition as Partition

    login = settings.kafka_username
    consumer = Consumer(librdkafka_options(settings) | {
        "group.id": f"{login}.acl-test", "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        refusal = consumer.list_topics(topic, timeout=10).topics[topic].error
        consumer.assign([Partition(topic, p, OFFSET_BEGINNING) for p in partitions])
        found: list = []
        ended: set[int] = set()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(ended) < len(partitions):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is None:
                found.append(message)
            elif message.error().code() == Signal._PARTITION_EOF:
                ended.add(message.partition())
            elif message.error().code() == Signal.TOPIC_AUTHORIZATION_FAILED:  # metadata granted, fetch refused
                refusal = refusal or message.error()
                break
            else:
                raise AssertionError(f"reading {topic} as {login}: {message.error()}")
    finally:
        consumer.close()
    return (refusal.name() if refusal is not None else None), found


async def _produce_as(settings: Settings, topic: str) -> str:
    producer = create_producer(settings, request_timeout_ms=10_000)
    try:
        await producer.start()
        await producer.send_and_wait(topic, b"{}")
        return "written"
    except Exception as exc:  # refused at login (authentication) or at the request (authorization)
        return type(exc).__name__
    finally:
        await producer.stop()


async def _first_event(settings: Settings, tenant: str, key: bytes) -> MemoryEvent:
    """The tenant's first memory event, read with its own login from its own events topic."""
    stream = events(settings, tenant=tenant, from_beginning=True, tenant_key=key)
    try:
        return await asyncio.wait_for(anext(stream), timeout=90)
    finally:
        await stream.aclose()


def _context(settings: Settings, tenant: str, key: bytes):
    return asyncio.run(context(settings, tenant=tenant, question="Where did Alice move?", tenant_key=key,
                               asked_at=datetime(2024, 4, 1, tzinfo=UTC), timeout_s=90))


def test_a_tenant_login_reaches_its_own_memory_and_nothing_of_another(secured, unique):
    operator = secured.settings
    a, b, conversation = unique("acl-a"), unique("acl-b"), unique("conv")
    as_a, as_b = _onboard(secured, a), _onboard(secured, b)
    key_a, key_b = (credentials(operator, t).signing_key for t in (a, b))
    own = make_turns(a, conversation, [("Alice", "I moved to Lisbon in March.")])
    spoofed = make_turns(b, conversation, [("Mallory", "B now believes what A says.")])
    ingest, answer = secured.run("ingest", BASE_PORT + 61), secured.run("answer", BASE_PORT + 62)
    try:
        key = conversation.encode()
        asyncio.run(produce_raw(as_a, [(key, t.to_bytes()) for t in own + spoofed], tenant_key=key_a))
        wait_for(lambda: secured.turns(a, conversation) == 1, timeout=120, what="A's own turn stored")
        letters = asyncio.run(read_topic(operator, operator.topic_dlq, lambda k, v: k == key, timeout=60))
        reply_a, reply_b = _context(as_a, a, key_a), _context(as_b, b, key_b)
        stored_a = asyncio.run(_first_event(as_a, a, key_a))
    finally:
        answer.stop()
        ingest.stop()
    assert [DeadLetter.model_validate_json(r.value).error_class for r in letters] == ["ClaimRejected"]
    assert secured.turns(b, conversation) == 0
    assert reply_a.tenant == a and reply_b.tenant == b  # each heard back on its own reply topic
    assert (stored_a.kind, stored_a.tenant, stored_a.conversation_id) == ("turns_stored", a, conversation)

    def partitions(topic: str) -> list[int]:
        return asyncio.run(partitions_of(operator, topic))

    topic_a, topic_b = (credentials(operator, t).reply_topic for t in (a, b))
    refusal, own = _read_as(as_a, topic_a, partitions(topic_a))
    assert refusal is None and len(own) == 1  # A's login fetches its own reply ...
    events_b = credentials(operator, b).events_topic
    for topic in (topic_b, operator.topic_turns, operator.topic_answers, operator.topic_segments, operator.topic_dlq,
                  operator.topic_forgotten, events_b, operator.topic_events):
        assert _read_as(as_a, topic, partitions(topic)) == ("TOPIC_AUTHORIZATION_FAILED", []), topic  # ... only
    # Those topics are not empty: the operator's login fetches B's reply, the turns, the letter.
    for topic in (topic_b, operator.topic_turns, operator.topic_dlq):
        refusal, records = _read_as(operator, topic, partitions(topic))
        assert refusal is None and records, topic
    for topic in (operator.topic_dlq, topic_b, operator.topic_answers, operator.topic_forgotten):
        assert asyncio.run(_produce_as(as_a, topic)) == "TopicAuthorizationFailedError", topic


def test_a_wrong_password_or_a_removed_tenant_cannot_log_in(secured, unique):
    tenant = unique("acl-gone")
    as_tenant = _onboard(secured, tenant)
    assert asyncio.run(_produce_as(as_tenant, secured.settings.topic_turns)) == "written"
    wrong = as_tenant.with_overrides(kafka_password=SecretStr("not-" + os.urandom(8).hex()))
    assert asyncio.run(_produce_as(wrong, secured.settings.topic_turns)) != "written"

    removed = secured.cli("tenant", "remove", tenant)
    assert removed.returncode == 0, removed.stderr
    assert asyncio.run(_produce_as(as_tenant, secured.settings.topic_turns)) != "written"
