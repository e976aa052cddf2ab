"""Integration fixtures: the real stack (Kafka, PostgreSQL with AGE + pgvector,
the llama.cpp model server and both workers), started once per session under
its own state directory and ports so it never touches a running demo."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

ROOT = Path(__file__).resolve().parents[2]

# The test stack's own home and ports (overridable from the environment).
TEST_ENV = {
    "EPISTREAM_HOME": str(ROOT / ".epistream-test"),
    "EPISTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:29092",
    "EPISTREAM_KAFKA_CONTROLLER_PORT": "29093",
    "EPISTREAM_MODEL_SERVER_PORT": "28080",
    "EPISTREAM_LLM_BASE_URL": "http://127.0.0.1:28080/v1",
    "EPISTREAM_INGEST_METRICS_PORT": "29101",
    "EPISTREAM_ANSWER_METRICS_PORT": "29102",
    "EPISTREAM_KAFKA_HEAP": "512m",
    # Small segments that close quickly, so the slow path runs within a test.
    "EPISTREAM_SEGMENT_MAX_TOKENS": "400",
    "EPISTREAM_SEGMENT_IDLE_S": "3",
    "EPISTREAM_SEGMENT_CHECK_EVERY_S": "1",
    "EPISTREAM_EXTRACTOR_MAX_TOKENS": "1024",
    # CPU model calls on a busy 2-core machine: generous timeouts, not flaky tests.
    "EPISTREAM_LLM_TIMEOUT_S": "240",
    # The tiny CPU model takes seconds a step: keep the agentic loop short in tests.
    "EPISTREAM_AGENTIC_MAX_STEPS": "3",
    "EPISTREAM_SUPERVISOR_METRICS_PORT": "29103",
}
for _name, _value in TEST_ENV.items():
    os.environ.setdefault(_name, _value)

from epistream.db import create_pool, database_url
from epistream.kafka_io import partitions_of
from epistream.readiness import stored_turns, wait_until
from epistream.settings import Settings
from infra import services, supervisor
from infra.process import pid_alive


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The health checks first (nothing else is worth running if they fail); the tests that kill
    services of the shared stack last."""
    def order(item: pytest.Item) -> int:
        if item.get_closest_marker("disruptive"):
            return 2
        return 0 if item.module is not None and item.module.__name__.endswith("test_health") else 1

    items.sort(key=order)  # stable: the usual order within each group


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings()


@pytest.fixture(scope="session")
def stack(settings: Settings):
    started = time.perf_counter()
    rows = services.up(settings)
    for row in rows:
        print(f"[stack] {row.name}: {row.detail}")
    print(f"[stack] up in {time.perf_counter() - started:.1f}s")
    yield settings
    if os.environ.get("EPISTREAM_TEST_KEEP_STACK") != "1":
        services.down(settings)
        left = [name for name, info in supervisor.read_state(settings.state_dir).get("services", {}).items()
                if info.get("pid") and pid_alive(info["pid"])]
        assert supervisor.supervisor_pid(settings.state_dir) is None and not left, f"still running after down: {left}"


@pytest.fixture(scope="session")
def db_url(stack: Settings) -> str:
    return database_url(stack)


@pytest.fixture
async def pool(stack: Settings) -> AsyncIterator:
    p = create_pool(stack)
    await p.open(wait=True)
    yield p
    await p.close()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Fresh ids per test, so tests never see each other's data."""
    run = uuid.uuid4().hex[:8]
    return lambda name: f"{name}-{run}"


def wait_for(check: Callable[[], object], *, timeout: float = 60.0, interval: float = 0.25, what: str = "condition"):
    """The product's wait (epistream.readiness), under the tests' argument names."""
    return wait_until(check, timeout_s=timeout, interval_s=interval, what=what)


def count_turns(db_url: str, tenant: str, conversation_id: str) -> int:
    with psycopg.connect(db_url) as conn:
        return stored_turns(conn, tenant, conversation_id=conversation_id)


async def read_topic(settings: Settings, topic: str, match: Callable[[bytes | None, bytes | None], bool],
                     *, want: int = 1, timeout: float = 60.0) -> list:
    """Read a topic from the beginning (no group) until `want` records match."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    found = []
    try:
        partitions = [TopicPartition(topic, p) for p in await partitions_of(settings, topic)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(found) < want:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                found.extend(r for r in records if match(r.key, r.value))
            await asyncio.sleep(0)
    finally:
        await consumer.stop()
    return found
