"""The ingest watermark of read-your-own-writes (sql/019, epistream/storage/watermarks.py) on PostgreSQL: the
ingest batch raises it in the transaction that stores the turns, through the unusable records it
dead-letters too; a replay or a previous owner's late batch never lowers it; a failed transaction
leaves it where it was; the workers' login reads it with one lookup, the readers' login cannot; a mark
beyond its partition's end (a topic deleted and created again) is forgotten."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from kafka import KafkaProducer

from epistream.contracts.positions import Position
from epistream.contracts.turns import Turn
from epistream.core.metrics import Metrics
from epistream.messaging.kafka_io import partition_lag
from epistream.messaging.topics import create_topic
from epistream.models.embeddings import Embedder
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.storage.db import create_pool, database_url, reader_url
from epistream.storage.watermarks import advance, forget_beyond_the_log, stored_through, unmet

from .helpers import LONG_SEGMENTS, T0

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def embedder(postgres) -> Embedder:
    return Embedder.from_settings(postgres)


def _turn(tenant: str, n: int) -> bytes:
    return Turn(tenant=tenant, conversation_id="c", turn_id=f"t{n:03d}", speaker="Ana", text=f"turn {n} at the harbour",
                ts=T0 + timedelta(minutes=n)).to_bytes()


def _records(topic: str, partition: int, values: list[tuple[int, bytes]]) -> list[RawRecord]:
    now_ms = int(time.time() * 1000)
    return [RawRecord(topic, partition, offset, b"c", value, now_ms) for offset, value in values]


def _ingest(postgres, embedder, *batches: list[RawRecord]) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """Each batch through the real ingest path, then the marks of the batches' topic as the answer
    worker reads them (with the workers' login)."""

    async def go() -> dict[int, int]:
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            for batch in batches:
                await ingest_batch(batch, pool=pool, embedder=embedder, metrics=Metrics.create(),
                                   segmenter=LONG_SEGMENTS, max_backoff_s=0.2)
            return await stored_through(pool, batches[0][0].topic, range(4))
        finally:
            await pool.close()

    return asyncio.run(go())


def test_a_batch_raises_its_partitions_marks_through_its_last_record_dead_lettered_ones_too(postgres, embedder):
    topic, tenant = f"wm-{uuid.uuid4().hex[:8]}", f"wm-{uuid.uuid4().hex[:8]}"
    batch = _records(topic, 0, [(10, _turn(tenant, 1)), (11, _turn(tenant, 2)), (12, b"not json")])
    batch += _records(topic, 2, [(5, _turn(tenant, 3))])
    assert _ingest(postgres, embedder, batch) == {0: 12, 2: 5}  # partition 1: nothing stored, no mark


def test_a_replay_or_a_late_batch_of_a_previous_owner_never_lowers_the_mark(postgres, embedder):
    topic, tenant = f"wm-{uuid.uuid4().hex[:8]}", f"wm-{uuid.uuid4().hex[:8]}"
    ahead = _records(topic, 1, [(40, _turn(tenant, 4)), (41, _turn(tenant, 5))])
    late = _records(topic, 1, [(20, _turn(tenant, 1)), (21, _turn(tenant, 2))])
    assert _ingest(postgres, embedder, ahead, late) == {1: 41}
    assert _ingest(postgres, embedder, _records(topic, 1, [(42, b"{}")])) == {1: 42}  # a batch of dead letters alone


def test_a_batch_that_could_store_nothing_leaves_the_mark_where_it_was(postgres, embedder):
    topic, tenant = f"wm-{uuid.uuid4().hex[:8]}", f"wm-{uuid.uuid4().hex[:8]}"
    assert _ingest(postgres, embedder, _records(topic, 0, [(3, _turn(tenant, 1))])) == {0: 3}
    # Every record fails on its own (set aside, to be dead-lettered): no transaction commits, so the
    # mark stays; a read waiting for offset 4 says it is incomplete until a later record is stored.
    assert _ingest(postgres, Broken(), _records(topic, 0, [(4, _turn(tenant, 2))])) == {0: 3}


class Broken:
    """An embedder that fails every call: each record of the batch is set aside, none stored."""

    def embed(self, texts: list[str]):  # type: ignore[no-untyped-def]
        raise RuntimeError("the embedder is broken")


def test_the_workers_login_reads_the_marks_and_the_readers_login_may_not(postgres, embedder):
    topic, tenant = f"wm-{uuid.uuid4().hex[:8]}", f"wm-{uuid.uuid4().hex[:8]}"
    _ingest(postgres, embedder, _records(topic, 3, [(7, _turn(tenant, 1))]))
    with psycopg.connect(database_url(postgres), autocommit=True) as conn:
        assert conn.execute("SELECT stored_through FROM memory.ingest_watermarks WHERE topic = %s",
                            (topic,)).fetchone() == (7,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM memory.ingest_watermarks WHERE topic = %s", (topic,))
    with psycopg.connect(reader_url(postgres, tenant), autocommit=True) as conn, \
            pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT * FROM memory.ingest_watermarks")


def _produce(settings, topic: str, *, partition: int, count: int) -> None:  # type: ignore[no-untyped-def]
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    try:
        for n in range(count):
            producer.send(topic, value=f"turn {n}".encode(), partition=partition).get(timeout=30)
    finally:
        producer.close()


async def test_a_mark_beyond_its_partitions_end_is_forgotten_as_a_recreated_topics(kafka, pool, unique):
    """A topic deleted and created again starts its offsets at 0; marks of the old one, beyond the new
    log's end, are set to -1 by the ingest worker's tick, so a read after offset 0 waits for it; a mark
    within the log is kept."""
    topic = unique("wm-recreated")
    await create_topic(kafka, topic, partitions=2)
    _produce(kafka, topic, partition=0, count=2)
    async with pool.connection() as conn, conn.transaction():
        await advance(conn, {(topic, 0): 1, (topic, 1): 40})  # partition 1's from the earlier incarnation

    async def ends() -> dict[int, int]:
        lag = await partition_lag(kafka, "no-such-group", [topic])
        return {partition: end for (_, partition), (_, end) in lag.items()}

    assert await forget_beyond_the_log(pool, topic, ends) == {1: 40}
    marks = await stored_through(pool, topic)
    assert marks == {0: 1, 1: -1}
    assert unmet([Position(conversation_id="c", partition=1, offset=0)], marks) != []
    _produce(kafka, topic, partition=1, count=1)
    async with pool.connection() as conn, conn.transaction():
        await advance(conn, {(topic, 1): 0})  # this incarnation's first turn stored: raised from -1
    assert await stored_through(pool, topic) == {0: 1, 1: 0}
    assert await forget_beyond_the_log(pool, topic, ends) == {}  # nothing beyond the log now
