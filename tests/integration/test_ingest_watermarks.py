"""The ingest watermark of read-your-own-writes (sql/019 and 022, epistream/storage/watermarks.py) on
PostgreSQL: the ingest batch raises it in the transaction that stores the turns, through the unusable
records it dead-letters too; records never handed over hold it below them until they are stored; a
replay or a previous owner's late batch never lowers it; the workers' login reads it with one lookup,
the readers' login cannot; a mark beyond its partition's end (a topic deleted and created again) is
forgotten."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from kafka import KafkaProducer

from epistream.consumers.read_after import read_after
from epistream.contracts.positions import Position
from epistream.contracts.turns import Turn
from epistream.core.metrics import Metrics
from epistream.errors import ServiceError
from epistream.messaging.kafka_io import create_librdkafka_admin, partition_lag, records_between, topic_id
from epistream.messaging.topics import create_topic, delete_topics
from epistream.models.embeddings import Embedder
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.storage.db import create_pool, database_url, reader_url
from epistream.storage.watermarks import (
    advance,
    forget_beyond_the_log,
    forget_other_incarnation,
    gaps,
    stored_through,
    unmet,
)

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


def test_a_record_that_fails_on_its_own_is_done_with_and_passes_the_mark(postgres, embedder):
    topic, tenant = f"wm-{uuid.uuid4().hex[:8]}", f"wm-{uuid.uuid4().hex[:8]}"
    assert _ingest(postgres, embedder, _records(topic, 0, [(3, _turn(tenant, 1))])) == {0: 3}
    # Every record fails on its own (set aside, to be dead-lettered): ingest is done with it, so it is
    # covered too; left out, its offset would be a gap that holds the mark below every later turn.
    assert _ingest(postgres, Broken(), _records(topic, 0, [(4, _turn(tenant, 2))])) == {0: 4}


def test_records_never_handed_over_hold_the_mark_below_them_and_a_read_waiting_on_them_is_incomplete(
        postgres, embedder):
    """Faust skipped offsets 2 and 3 (fetched, never given to the agent) and the agent stored 4 and 5:
    the mark stays at 1, a read after offset 2 says incomplete, and the gap is named; once 2 and 3 are
    stored (the guard seeks back to them), the mark moves past all of them."""
    topic, tenant = f"wm-{uuid.uuid4().hex[:8]}", f"wm-{uuid.uuid4().hex[:8]}"
    first = _records(topic, 0, [(0, _turn(tenant, 0)), (1, _turn(tenant, 1))])
    after_the_skip = _records(topic, 0, [(4, _turn(tenant, 4)), (5, _turn(tenant, 5))])
    assert _ingest(postgres, embedder, first, after_the_skip) == {0: 1}

    async def read_and_gaps() -> tuple[str | None, dict[int, tuple[int, int]]]:
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            reason = await read_after(pool, topic, [Position(conversation_id="c", partition=0, offset=2)],
                                      timeout_s=0.3, metrics=Metrics.create())
            return reason, await gaps(pool, topic)
        finally:
            await pool.close()

    reason, gap = asyncio.run(read_and_gaps())
    assert reason is not None and "not stored" in reason and "c@0:2" in reason  # the reply: incomplete
    assert gap == {0: (2, 4)}
    assert _ingest(postgres, embedder, _records(topic, 0, [(2, _turn(tenant, 2)), (3, _turn(tenant, 3))])) == {0: 5}
    assert asyncio.run(read_and_gaps()) == (None, {})


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
        await advance(conn, {(topic, 0): [(0, 1)], (topic, 1): [(40, 40)]})  # partition 1's: the earlier incarnation

    async def ends() -> dict[int, int]:
        lag = await partition_lag(kafka, "no-such-group", [topic])
        return {partition: end for (_, partition), (_, end) in lag.items()}

    assert await forget_beyond_the_log(pool, topic, ends) == {1: 40}
    marks = await stored_through(pool, topic)
    assert marks == {0: 1, 1: -1}
    assert unmet([Position(conversation_id="c", partition=1, offset=0)], marks) != []
    _produce(kafka, topic, partition=1, count=1)
    async with pool.connection() as conn, conn.transaction():
        await advance(conn, {(topic, 1): [(0, 0)]})  # this incarnation's first turn stored: raised from -1
    assert await stored_through(pool, topic) == {0: 1, 1: 0}
    assert await forget_beyond_the_log(pool, topic, ends) == {}  # nothing beyond the log now


async def test_the_log_tells_a_gap_of_skipped_records_from_one_of_transaction_markers(kafka, unique):
    """What pipeline/gaps.py asks of a gap under the mark, on a real broker with a third party's
    transactional producer (kafka-python): an aborted transaction's record and its marker, and a
    commit marker, are offsets no consumer is given; a committed or plain record is one."""
    topic = unique("wm-gap")
    await create_topic(kafka, topic, partitions=1)
    plain = KafkaProducer(bootstrap_servers=kafka.kafka_bootstrap)
    transactional = KafkaProducer(bootstrap_servers=kafka.kafka_bootstrap, transactional_id=unique("wm-gap-tx"))
    try:
        transactional.init_transactions()

        def send(producer: KafkaProducer, value: bytes) -> int:
            return producer.send(topic, value=value, partition=0).get(timeout=30).offset

        first = send(plain, b"a")
        transactional.begin_transaction()
        aborted = send(transactional, b"b")
        transactional.abort_transaction()
        after_abort = send(plain, b"c")
        transactional.begin_transaction()
        committed = send(transactional, b"d")
        transactional.commit_transaction()
        last = send(plain, b"e")
    finally:
        transactional.close()
        plain.close()
    assert first < aborted < after_abort < committed < last
    assert await records_between(kafka, topic, 0, aborted, after_abort) is False  # aborted record, its marker
    assert await records_between(kafka, topic, 0, committed + 1, last) is False  # the commit marker
    assert await records_between(kafka, topic, 0, aborted, after_abort + 1) is True
    assert await records_between(kafka, topic, 0, committed, committed + 1) is True


async def test_marks_of_another_incarnation_of_the_topic_are_forgotten_by_its_id(kafka, pool, unique):
    """Marks are tied to the broker's topic id at the first tick; after the topic is deleted and created
    again (a new id), they start again from nothing, even while they lie inside the new log's end."""
    topic = unique("wm-incarnation")
    await create_topic(kafka, topic, partitions=1)
    admin = create_librdkafka_admin(kafka)
    first_id = await topic_id(admin, topic)
    async with pool.connection() as conn, conn.transaction():
        await advance(conn, {(topic, 0): [(0, 2)]})
    assert await forget_other_incarnation(pool, topic, first_id) == []  # tied to it, kept
    assert await stored_through(pool, topic) == {0: 2}

    await delete_topics(kafka, [topic])
    second_id = first_id
    for _ in range(100):  # the broker deletes in the background: create until the topic is a new one
        await create_topic(kafka, topic, partitions=1)
        with contextlib.suppress(ServiceError):  # between the deletion and the creation
            second_id = await topic_id(admin, topic)
        if second_id != first_id:
            break
        await asyncio.sleep(0.2)
    assert second_id != first_id
    _produce(kafka, topic, partition=0, count=5)  # the new log's end (5) is past the old mark (2)
    assert await forget_other_incarnation(pool, topic, second_id) == [0]
    assert await stored_through(pool, topic) == {0: -1}
    assert await forget_other_incarnation(pool, topic, second_id) == []  # now tied to the new one
