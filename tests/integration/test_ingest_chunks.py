"""The ingest batch in chunks against the real PostgreSQL (issue 13): chunks commit in partition order,
each in its own transaction; a permanent error in a later chunk never stores or counts an earlier one
twice; the next chunk is embedded while the current one is held in its transaction; the tombstone
guard is taken per chunk, so a forget that lands between two chunks stops the second."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import numpy as np
import psycopg
import pytest

from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.store.tombstones import LOCK_EXCLUSIVE, LOCK_SHARED, WHOLE_TENANT
from epistream.storage.db import create_pool

from .helpers import LONG_SEGMENTS as CONFIG
from .helpers import POISON, T0, PickyEmbedder

pytestmark = pytest.mark.integration


class RecordingEmbedder(PickyEmbedder):
    """The real embedder; notes when each call ended, and raises on one marked text."""

    def __init__(self, inner: Embedder) -> None:
        super().__init__(inner)
        self.calls: list[tuple[int, float]] = []
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = super().embed(texts)
        with self._lock:
            self.calls.append((len(texts), time.monotonic()))
        return vectors


@pytest.fixture(scope="module")
def embedder(postgres) -> Embedder:
    return Embedder.from_settings(postgres)


def turn(tenant: str, conversation: str, n: int, text: str | None = None) -> bytes:
    return Turn(tenant=tenant, conversation_id=conversation, turn_id=f"t{n:03d}", speaker="Ana",
                text=text or f"turn number {n} about the harbour", ts=T0 + timedelta(minutes=n),
                session_id="s0").to_bytes()


def records(values: list[bytes]) -> list[RawRecord]:
    now_ms = int(time.time() * 1000)
    return [RawRecord("memory.turns", 0, i, b"k", v, now_ms) for i, v in enumerate(values)]


async def run(postgres, batch: list[RawRecord], embedder, chunk: int, during=None):  # type: ignore[no-untyped-def]
    pool = create_pool(postgres)
    await pool.open(wait=True)
    try:
        task = asyncio.ensure_future(ingest_batch(batch, pool=pool, embedder=embedder, metrics=Metrics.create(),
                                                  segmenter=CONFIG, max_backoff_s=0.2, chunk_turns=chunk))
        if during is not None:
            await during(task)
        return await asyncio.wait_for(task, 120)
    finally:
        await pool.close()


def rows(db_url: str, tenant: str) -> list[tuple[str, object]]:
    """Each stored turn with when its transaction began (now(): one instant per transaction)."""
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT turn_id, stored_at FROM memory.turns WHERE tenant = %s ORDER BY turn_id",
                            (tenant,)).fetchall()


def test_chunks_commit_in_order_and_a_later_permanent_error_never_restores_an_earlier_chunk(
        postgres, db_url, unique, embedder):
    tenant, conversation = unique("tenant"), unique("conv")
    close = SegmentCloseRequest(kind="segment_close", tenant=tenant, conversation_id=conversation,
                                after_turn_id="t003").to_bytes()
    values = [turn(tenant, conversation, 1), turn(tenant, conversation, 2), turn(tenant, conversation, 3), close,
              turn(tenant, conversation, 4), turn(tenant, conversation, 5, f"{POISON} here"),
              turn(tenant, conversation, 6), turn(tenant, conversation, 7)]
    result = asyncio.run(run(postgres, records(values), RecordingEmbedder(embedder), chunk=2))

    assert [r.record.offset for r in result.dead] == [5]
    # One outcome per stored turn, each an insert: no committed chunk was written (or counted) again.
    assert [t.turn_id for t in result.stored] == ["t001", "t002", "t003", "t004", "t006", "t007"]
    assert result.outcomes == ["inserted"] * 6
    stored = rows(db_url, tenant)
    assert [turn_id for turn_id, _ in stored] == ["t001", "t002", "t003", "t004", "t006", "t007"]
    xact = dict(stored)
    # Chunks [t001 t002] [t003 close t004] then the failed [t005 t006] record by record, then [t007].
    assert xact["t001"] == xact["t002"] < xact["t003"] == xact["t004"] < xact["t006"] < xact["t007"]
    with psycopg.connect(db_url) as conn:
        segments = conn.execute("SELECT turn_ids FROM memory.segments WHERE tenant = %s ORDER BY seq",
                                (tenant,)).fetchall()
    assert segments[0][0] == ["t001", "t002", "t003"]  # the close applied where it stood, across chunks


def test_the_next_chunk_is_embedded_while_the_current_one_waits_in_its_transaction(
        postgres, db_url, unique, embedder):
    """A forget holding the conversation's lock stalls chunk 1 inside its transaction (its guard waits);
    chunk 2's embedding finishes meanwhile, and nothing is committed until the lock goes."""
    tenant, conversation = unique("tenant"), unique("conv")
    recording = RecordingEmbedder(embedder)
    batch = records([turn(tenant, conversation, n) for n in range(1, 7)])

    with psycopg.connect(db_url) as admin:
        admin.execute(LOCK_SHARED, (tenant, tenant, WHOLE_TENANT))
        admin.execute(LOCK_EXCLUSIVE, (tenant, tenant, conversation))

        async def during(task: asyncio.Future) -> None:
            deadline = time.monotonic() + 60
            while len(recording.calls) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(recording.calls) == 2, "chunk 2 was not embedded while chunk 1 waited"
            assert not task.done() and rows(db_url, tenant) == []
            await asyncio.sleep(0.3)
            assert len(recording.calls) == 2, "chunk 3 was embedded before chunk 1 was written"
            admin.rollback()  # the forget gives up: its locks go, no tombstone

        result = asyncio.run(run(postgres, batch, recording, chunk=2, during=during))
    assert result.dead == [] and result.outcomes == ["inserted"] * 6
    assert len(recording.calls) == 3 and len({x for _, x in rows(db_url, tenant)}) == 3


def test_a_forget_between_two_chunks_stops_the_second(postgres, db_url, unique, embedder):
    """Chunk 1 (conversation A) commits; a forget of conversation B commits before chunk 2 (B) takes
    its guard; chunk 2 then sees the tombstone and writes nothing."""
    tenant, a, b = unique("tenant"), unique("conv-a"), unique("conv-b")
    batch = records([turn(tenant, a, 1), turn(tenant, a, 2), turn(tenant, b, 3), turn(tenant, b, 4)])

    with psycopg.connect(db_url) as admin:
        admin.execute(LOCK_SHARED, (tenant, tenant, WHOLE_TENANT))
        admin.execute(LOCK_EXCLUSIVE, (tenant, tenant, b))

        async def during(task: asyncio.Future) -> None:
            deadline = time.monotonic() + 60
            while len(rows(db_url, tenant)) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert [t for t, _ in rows(db_url, tenant)] == ["t001", "t002"] and not task.done()
            admin.execute("INSERT INTO memory.tombstones (tenant, conversation_id) VALUES (%s, %s)", (tenant, b))
            admin.commit()

        result = asyncio.run(run(postgres, batch, embedder, chunk=2, during=during))
        admin.execute("DELETE FROM memory.tombstones WHERE tenant = %s", (tenant,))
        admin.commit()
    assert result.dead == [] and result.outcomes == ["inserted", "inserted", "tombstoned", "tombstoned"]
    assert [t for t, _ in rows(db_url, tenant)] == ["t001", "t002"]
