"""The ingest watermark of read-your-own-writes (sql/019, epistream/watermarks.py) on PostgreSQL: the
ingest batch raises it in the transaction that stores the turns, through the unusable records it
dead-letters too; a replay or a previous owner's late batch never lowers it; a failed transaction
leaves it where it was; the workers' login reads it with one lookup, the readers' login cannot."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import psycopg
import pytest

from epistream.contracts import Turn
from epistream.db import create_pool, database_url, reader_url
from epistream.embeddings import Embedder
from epistream.metrics import Metrics
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.watermarks import stored_through

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
