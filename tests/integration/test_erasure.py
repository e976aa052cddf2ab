"""Erasure that survives a rebuild: `epistream forget` records the erasure in the compacted
`memory.forgotten`, and an ingest worker rebuilding the memory from Kafka into an empty database
reads it before the turns, so the forgotten conversation does not come back; an erasure made on
another database while the rebuild runs reaches it too. Topic retention is set from the settings,
on create and again on every start. Each test runs on its own topics, group and databases."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from epistream.core.metrics import read_samples, sample_sum
from epistream.messaging.kafka_io import create_librdkafka_admin
from epistream.messaging.topics import drifted_configs, ensure_topics, set_topic_configs, topic_configs, topic_specs
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url

from .conftest import wait_for
from .deployments import BASE_PORT, TOPICS, Deployment, deployments
from .helpers import make_turns, produce_bytes, produce_turns

pytestmark = pytest.mark.integration


@pytest.fixture
def memories(kafka) -> Iterator[list[Deployment]]:
    """Two databases on the same topics: the original memory and the one rebuilt from Kafka."""
    with deployments(kafka, 2) as made:
        yield made


def test_a_rebuild_from_kafka_into_an_empty_database_does_not_bring_back_a_forgotten_conversation(memories, unique):
    original, rebuilt = memories
    tenant, gone, kept, late = unique("tenant"), unique("gone"), unique("kept"), unique("late")
    said = [("Alice", "I moved to Lisbon last Wednesday."), ("Bob", "Nice!"), ("Alice", "The ferry is lovely.")]
    produce_turns(original.settings, make_turns(tenant, gone, said) + make_turns(tenant, kept, said)
                  + make_turns(tenant, late, said))
    worker = original.run("ingest", BASE_PORT)
    try:
        wait_for(lambda: all(original.turns(tenant, c) == 3 for c in (gone, kept, late)), timeout=120,
                 what="the original memory stored")
        done = original.cli("forget", "--tenant", tenant, "--conversation", gone)
        assert done.returncode == 0 and original.settings.topic_forgotten in done.stdout, done.stderr
        assert original.turns(tenant, gone) == 0
    finally:
        worker.stop()

    # The rebuild: a new group reads memory.turns from its start into an empty database.
    worker = rebuilt.run("ingest", BASE_PORT + 1)
    try:
        wait_for(lambda: rebuilt.turns(tenant, kept) == 3 and rebuilt.turns(tenant, late) == 3, timeout=120,
                 what="the rebuilt memory stored")
        # A turn of the forgotten conversation produced after the rebuild started is skipped as well.
        produce_turns(rebuilt.settings, make_turns(tenant, gone, [("Alice", "One more thing.")]))
        # Then a sentinel on the same partition: once it is stored, that turn has been seen.
        sentinel = make_turns(tenant, unique("sentinel"), [("Alice", "sentinel")])[0]
        produce_bytes(rebuilt.settings, [(gone.encode(), sentinel.to_bytes())])
        wait_for(lambda: rebuilt.turns(tenant, sentinel.conversation_id) == 1, timeout=60, what="sentinel stored")
        assert rebuilt.turns(tenant, gone) == 0
        # Read before the turns, at start-up: its four turns were skipped on the way in, never stored.
        assert "read 1 erasures from" in worker.log_file.read_text()
        assert "applied 1 this database had not seen" in worker.log_file.read_text()
        samples = read_samples(f"http://127.0.0.1:{BASE_PORT + 1}/metrics")
        assert sample_sum(samples, "epistream_ingest_turns_total", outcome="tombstoned") == 4
        with psycopg.connect(admin_database_url(rebuilt.settings)) as conn:
            assert conn.execute("SELECT count(*) FROM memory.tombstones WHERE tenant = %s AND conversation_id = %s",
                                (tenant, gone)).fetchone() == (1,)

        # Forgotten on the original database while the rebuild runs: the rebuilt memory forgets it too.
        assert original.cli("forget", "--tenant", tenant, "--conversation", late).returncode == 0
        wait_for(lambda: rebuilt.turns(tenant, late) == 0, timeout=60, what="the later erasure applied")
        assert rebuilt.turns(tenant, kept) == 3
    finally:
        worker.stop()


def _configs(settings: Settings, topic: str) -> dict[str, tuple[str, bool]]:
    return topic_configs(create_librdkafka_admin(settings), [topic])[topic]


def _settles(settings: Settings, topic: str, **expected: tuple[str, bool]) -> None:
    """Wait until the broker describes these configs of the topic: a describe may lag a change by a moment."""
    def matches() -> bool:
        configs = _configs(settings, topic)
        return all(configs.get(k.replace("_", ".")) == v for k, v in expected.items())
    wait_for(matches, timeout=20, what=f"{topic}'s configs {expected}")


def test_topic_retention_follows_the_settings_on_create_and_on_every_start(kafka):
    suffix = uuid.uuid4().hex[:8]
    settings = kafka.with_overrides(**{f"topic_{t}": f"retention-{suffix}.{t}" for t in TOPICS},
                                    dlq_retention_days=14, topic_retention_days=0.5)
    asyncio.run(ensure_topics(settings))
    _settles(settings, settings.topic_dlq, retention_ms=(str(14 * 86_400_000), True))
    _settles(settings, settings.topic_answers, retention_ms=(str(43_200_000), True))
    _settles(settings, settings.topic_turns, retention_ms=("-1", True))
    _settles(settings, settings.topic_forgotten, cleanup_policy=("compact", True), retention_ms=("-1", True))

    # A read taken before the operator sets something of their own on the topic...
    stale = {settings.topic_dlq: _configs(settings, settings.topic_dlq)}
    set_topic_configs(create_librdkafka_admin(settings), {settings.topic_dlq: {"max.message.bytes": "2000000"}})
    _settles(settings, settings.topic_dlq, max_message_bytes=("2000000", True))
    # ...and a start with a new retention that acts on it: only the retention changes, the operator's
    # setting stays (replacing the topic's whole set from the stale read dropped it).
    shorter = settings.with_overrides(dlq_retention_days=2)
    changes = drifted_configs(stale, [t for t in topic_specs(shorter) if t.name == settings.topic_dlq])
    assert changes == {settings.topic_dlq: {"retention.ms": str(2 * 86_400_000)}}
    set_topic_configs(create_librdkafka_admin(shorter), changes)
    _settles(settings, settings.topic_dlq, retention_ms=(str(2 * 86_400_000), True),
             max_message_bytes=("2000000", True))

    # A start with the settings the topics already have changes nothing.
    asyncio.run(ensure_topics(shorter))
    _settles(settings, settings.topic_dlq, retention_ms=(str(2 * 86_400_000), True),
             max_message_bytes=("2000000", True))
    # And every start sets a changed retention again.
    asyncio.run(ensure_topics(shorter.with_overrides(dlq_retention_days=3)))
    _settles(settings, settings.topic_dlq, retention_ms=(str(3 * 86_400_000), True),
             max_message_bytes=("2000000", True))


def test_retention_settings_refuse_zero_and_negative_days_other_than_forever():
    from pydantic import ValidationError

    for bad in (0, -2, -0.5):
        with pytest.raises(ValidationError, match="positive number of days, or -1"):
            Settings(dlq_retention_days=bad)
    assert Settings(turns_retention_days=-1).turns_retention_days == -1
