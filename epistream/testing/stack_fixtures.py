"""The test stack's pytest fixtures, for tests/ and bench/tests/ alike (a plugin loaded once per session:
``-p epistream.testing.stack_fixtures`` in pyproject's pytest addopts). The real services, started under
the tests' own state directory and ports (so they never touch a running demo), in three tiers.

Each test asks for the tier it needs, and only that tier's services run for it:

  ``postgres``  the embedded PostgreSQL (AGE + pgvector) alone, with a database of
                the tier's own, so the shared indexer never closes or enriches
                these tests' conversations; a scripted model where one is needed.
  ``kafka``     PostgreSQL and the Kafka broker (tests start their own worker
                against a scripted OpenAI-compatible server).
  ``stack``     everything: Kafka, PostgreSQL, the llama.cpp model server, both
                workers (end to end).

Tests run tier by tier (PostgreSQL, Kafka, end to end; the ones that kill services
last), so the heavy services start only when the first test that needs them runs.
``pytest -m "not e2e"`` never starts the model server.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psycopg
import pytest
from aiokafka import TopicPartition

from epistream.infra import services, supervisor
from epistream.infra.process import pid_alive
from epistream.messaging.kafka_io import create_consumer, partitions_of
from epistream.ops.readiness import stored_turns, wait_until
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url, create_pool, on_database
from epistream.testing.databases import drop_database, own_database

ROOT = Path(__file__).resolve().parents[2]  # the repository

# The test stack's own home and ports (overridable from the environment), set as the plugin loads:
# before any test module is collected, since settings are read from the environment when built.
TEST_ENV = {
    "EPISTREAM_HOME": str(ROOT / ".epistream-test"),
    "EPISTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:29092",
    "EPISTREAM_KAFKA_CONTROLLER_PORT": "29093",
    "EPISTREAM_MODEL_SERVER_PORT": "28080",
    "EPISTREAM_LLM_BASE_URL": "http://127.0.0.1:28080/v1",
    "EPISTREAM_INGEST_METRICS_PORT": "29101",
    "EPISTREAM_ANSWER_METRICS_PORT": "29102",
    "EPISTREAM_ENRICH_METRICS_PORT": "29104",
    "EPISTREAM_KAFKA_HEAP": "512m",
    # Small segments that close quickly, so the slow path runs within a test.
    "EPISTREAM_SEGMENT_MAX_TOKENS": "400",
    "EPISTREAM_SEGMENT_IDLE_S": "3",
    "EPISTREAM_SEGMENT_CHECK_EVERY_S": "1",
    "EPISTREAM_EVENTS_RELAY_EVERY_S": "1",
    "EPISTREAM_EXTRACTOR_MAX_TOKENS": "1024",
    # CPU model calls on a busy 2-core machine: generous timeouts, not flaky tests.
    "EPISTREAM_LLM_TIMEOUT_S": "240",
    # The tiny CPU model takes seconds a step: keep the agentic loop short in tests.
    "EPISTREAM_AGENTIC_MAX_STEPS": "3",
    "EPISTREAM_SUPERVISOR_METRICS_PORT": "29103",
}
for _name, _value in TEST_ENV.items():
    os.environ.setdefault(_name, _value)

TIERS = ("postgres", "kafka", "stack")  # cheapest first; a test's tier is the richest it asks for
TIER_SERVICES: dict[str, set[str] | None] = {"postgres": {"postgres"}, "kafka": {"postgres", "kafka"}, "stack": None}
MARKERS = {"postgres": "pg", "kafka": "kafka", "stack": "e2e"}


def tier_of(item: pytest.Item) -> str:
    names = getattr(item, "fixturenames", ())
    return next((t for t in reversed(TIERS) if t in names), "postgres")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tier by tier, cheapest first; within the end-to-end tier the health checks first (nothing else
    is worth running if they fail); the tests that kill services of the shared stack last."""
    def order(item: pytest.Item) -> tuple[int, int]:
        if item.get_closest_marker("disruptive"):
            return (len(TIERS), 0)
        health = item.module is not None and item.module.__name__.endswith("test_health")
        return (TIERS.index(tier_of(item)), 0 if health else 1)

    for item in items:
        item.add_marker(MARKERS[tier_of(item)])
    items.sort(key=order)  # stable: the usual order within each group


class TestServices:
    """Starts each tier's services once, on first use; stops everything at the end."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started: set[str] = set()
        self.tier_database = f"tier_{uuid.uuid4().hex[:8]}"
        self._tier_settings: Settings | None = None

    def ensure(self, tier: str) -> Settings:
        if tier not in self.started:
            started = time.perf_counter()
            services_wanted = TIER_SERVICES[tier]
            rows = services.up(self.settings, workers=services_wanted is None, only=services_wanted)
            for row in rows:
                print(f"[{tier}] {row.name}: {row.detail}")
            print(f"[{tier}] up in {time.perf_counter() - started:.1f}s")
            self.started.update(TIERS[: TIERS.index(tier) + 1])
        if tier == "stack":
            return self.settings
        if self._tier_settings is None:
            url = own_database(self.settings, self.tier_database)
            self._tier_settings = on_database(self.settings, url)
        return self._tier_settings

    def stop(self) -> None:
        if not self.started or os.environ.get("EPISTREAM_TEST_KEEP_STACK") == "1":
            return
        if self._tier_settings is not None:
            drop_database(self.settings, self.tier_database)
        services.down(self.settings)
        left = [name for name, info in supervisor.read_state(self.settings.state_dir).get("services", {}).items()
                if info.get("pid") and pid_alive(info["pid"])]
        assert supervisor.supervisor_pid(self.settings.state_dir) is None and not left, \
            f"still running after down: {left}"


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings()


@pytest.fixture(scope="session")
def test_services(settings: Settings):
    manager = TestServices(settings)
    yield manager
    manager.stop()


@pytest.fixture(scope="session")
def postgres(test_services: TestServices) -> Settings:
    """The PostgreSQL tier: settings whose database is the tier's own (no Kafka, no model)."""
    return test_services.ensure("postgres")


@pytest.fixture(scope="session")
def kafka(test_services: TestServices) -> Settings:
    """The Kafka tier: PostgreSQL (the tier's own database) and the broker; no model server, no workers."""
    return test_services.ensure("kafka")


@pytest.fixture(scope="session")
def stack(test_services: TestServices) -> Settings:
    """The end-to-end tier: every service and both workers, on the stack's own database."""
    return test_services.ensure("stack")


def _tier_settings(request: pytest.FixtureRequest) -> Settings:
    """The settings of the richest tier this test asks for (the database its tier writes to)."""
    return request.getfixturevalue(tier_of(request.node))


@pytest.fixture
def db_url(request: pytest.FixtureRequest) -> str:
    return admin_database_url(_tier_settings(request))


@pytest.fixture
async def pool(request: pytest.FixtureRequest) -> AsyncIterator:
    p = create_pool(_tier_settings(request))
    await p.open(wait=True)
    yield p
    await p.close()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Fresh ids per test, so tests never see each other's data."""
    run = uuid.uuid4().hex[:8]
    return lambda name: f"{name}-{run}"


def wait_for(check: Callable[[], object], *, timeout: float = 60.0, interval: float = 0.25, what: str = "condition"):
    """The product's wait (epistream.ops.readiness), under the tests' argument names."""
    return wait_until(check, timeout_s=timeout, interval_s=interval, what=what)


def count_turns(db_url: str, tenant: str, conversation_id: str) -> int:
    with psycopg.connect(db_url) as conn:
        return stored_turns(conn, tenant, conversation_id=conversation_id)


async def read_topic(settings: Settings, topic: str, match: Callable[[bytes | None, bytes | None], bool],
                     *, want: int = 1, timeout: float = 60.0) -> list:
    """Read a topic from the beginning (no group) until `want` records match; only committed records
    (the answer worker writes in transactions: an aborted answer is no answer)."""
    consumer = create_consumer(settings, enable_auto_commit=False, group_id=None, isolation_level="read_committed")
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
