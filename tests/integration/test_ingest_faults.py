"""The ingest batch under faults, on PostgreSQL alone (issue 11, defects 1, 2, 4 and 7): a record that
raises outside the per-row path is dead-lettered alone; records apply in partition order; a corrected
turn rebuilds its closed segment; the outbox marks published only what Kafka acknowledged; pooled
connections survive their server-side death."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta

import psycopg
import pytest

from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.core.metrics import Metrics
from epistream.errors import ContractError
from epistream.models.embeddings import Embedder
from epistream.pipeline import outbox
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig

from .helpers import LONG_SEGMENTS as CONFIG
from .helpers import POISON, T0, PickyEmbedder

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def embedder(postgres) -> Embedder:
    return Embedder.from_settings(postgres)


def turn(tenant: str, conversation: str, n: int, text: str | None = None) -> Turn:
    return Turn(tenant=tenant, conversation_id=conversation, turn_id=f"t{n:03d}", speaker="Ana",
                text=text or f"turn number {n} about the harbour", ts=T0 + timedelta(minutes=n), session_id="s0")


def records(values: list[bytes], key: bytes = b"k", first_offset: int = 0) -> list[RawRecord]:
    now_ms = int(time.time() * 1000)
    return [RawRecord("memory.turns", 0, first_offset + i, key, v, now_ms) for i, v in enumerate(values)]


def ingest(postgres, batches: list[list[RawRecord]], embedder, segmenter: SegmenterConfig | None = CONFIG):  # type: ignore[no-untyped-def]
    from epistream.storage.db import create_pool

    async def go():  # type: ignore[no-untyped-def]
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            return [await ingest_batch(b, pool=pool, embedder=embedder, metrics=Metrics.create(), segmenter=segmenter,
                                       max_backoff_s=0.2) for b in batches]
        finally:
            await pool.close()

    return asyncio.run(go())


def stored(db_url: str, tenant: str) -> list[tuple[str, str]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT turn_id, text FROM memory.turns WHERE tenant = %s ORDER BY turn_id",
                            (tenant,)).fetchall()


def test_a_record_that_raises_outside_the_contract_is_dead_lettered_alone_and_the_rest_stored(
        postgres, db_url, unique, embedder):
    tenant, conversation = unique("tenant"), unique("conv")
    good = [turn(tenant, conversation, i) for i in range(1, 4)]
    poison = turn(tenant, conversation, 9, f"{POISON} here")
    batch = records([good[0].to_bytes(), poison.to_bytes(), good[1].to_bytes(), good[2].to_bytes()])
    (result,) = ingest(postgres, [batch], PickyEmbedder(embedder))
    assert [r.record.offset for r in result.dead] == [1]
    assert isinstance(result.dead[0].error, ValueError) and "tokenizer" in str(result.dead[0].error)
    assert stored(db_url, tenant) == [(t.turn_id, t.text) for t in good]


def test_a_nul_in_the_tenant_is_refused_by_the_contract_and_the_batch_goes_on(postgres, db_url, unique, embedder):
    tenant, conversation = unique("tenant"), unique("conv")
    good = turn(tenant, conversation, 1)
    bad = json.loads(turn(tenant, conversation, 2).to_bytes())
    bad["tenant"] = tenant + "\x00x"
    (result,) = ingest(postgres, [records([json.dumps(bad).encode(), good.to_bytes()])], embedder)
    assert len(result.dead) == 1 and isinstance(result.dead[0].error, ContractError)
    assert "NUL" in str(result.dead[0].error) and "tenant" in str(result.dead[0].error)
    assert stored(db_url, tenant) == [("t001", good.text)]


def test_an_instant_psycopg_cannot_read_back_is_refused_and_the_conversation_stays_readable(
        postgres, db_url, unique, embedder):
    tenant, conversation = unique("tenant"), unique("conv")
    bad = json.loads(turn(tenant, conversation, 1).to_bytes())
    bad["ts"] = "0001-01-01T00:00:00+14:00"
    later = turn(tenant, conversation, 2)
    (result,) = ingest(postgres, [records([json.dumps(bad).encode(), later.to_bytes()])], embedder)
    assert len(result.dead) == 1 and "ts" in str(result.dead[0].error)
    with psycopg.connect(db_url) as conn:  # every stored time reads back
        assert conn.execute("SELECT turn_id, ts FROM memory.turns WHERE tenant = %s", (tenant,)).fetchall() == [
            ("t002", later.ts)]


def close_request(tenant: str, conversation: str, after: str) -> bytes:
    return SegmentCloseRequest(kind="segment_close", tenant=tenant, conversation_id=conversation,
                               after_turn_id=after).to_bytes()


def segments_of(db_url: str, tenant: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT segment_id, turn_ids, raw_text, status, published_at IS NULL FROM memory.segments"
                            " WHERE tenant = %s ORDER BY seq", (tenant,)).fetchall()


def test_a_close_request_applies_where_it_stands_in_the_partition_whatever_the_batch_boundaries(
        postgres, db_url, unique, embedder):
    cuts = []
    for boundary in ([3], [1, 2, 3], [2]):  # one batch; one record a batch; cut after the close
        tenant, conversation = unique(f"tenant{len(cuts)}"), unique("conv")
        values = [turn(tenant, conversation, 1).to_bytes(), close_request(tenant, conversation, "t001"),
                  turn(tenant, conversation, 2).to_bytes()]
        recs = records(values)
        batches, start = [], 0
        for end in boundary:
            batches.append(recs[start:end])
            start = end
        ingest(postgres, batches, embedder)
        cuts.append([row[1] for row in segments_of(db_url, tenant)])
    assert cuts == [[["t001"]]] * 3


def test_a_corrected_turn_rebuilds_its_closed_segment_and_sends_it_to_be_enriched_again(
        postgres, db_url, unique, embedder):
    tenant, conversation = unique("tenant"), unique("conv")
    first, second = turn(tenant, conversation, 1), turn(tenant, conversation, 2)
    (closing,) = ingest(postgres, [records([first.to_bytes(), second.to_bytes(),
                                            close_request(tenant, conversation, "t002")])], embedder)
    (sid,) = [s for _, s in closing.closed_segments]
    with psycopg.connect(db_url) as conn:  # as if published and enriched
        conn.execute("UPDATE memory.segments SET status = 'enriched', published_at = now(), prompt_version = 'v1'"
                     " WHERE tenant = %s", (tenant,))
    corrected = first.model_copy(update={"text": "turn number 1, corrected: the ferry left at dawn"})
    (correction,) = ingest(postgres, [records([corrected.to_bytes()], first_offset=3)], embedder)
    assert correction.outcomes == ["updated"] and correction.closed_segments == [(tenant, sid)]
    ((_, turn_ids, raw_text, status, unpublished),) = segments_of(db_url, tenant)
    assert turn_ids == ["t001", "t002"] and status == "pending" and unpublished
    assert "corrected: the ferry left at dawn" in raw_text and "turn number 2" in raw_text
    (replay,) = ingest(postgres, [records([corrected.to_bytes()], first_offset=4)], embedder)
    assert replay.outcomes == ["unchanged"] and replay.closed_segments == []


def test_a_turn_sent_again_in_the_same_batch_is_written_in_order_with_each_outcome(postgres, db_url, unique, embedder):
    """The batch's turns are written by one statement a run (pipeline/store/turns.py); a turn there twice
    is written as it came: first inserted, then its correction, then the same correction changing nothing."""
    tenant, conversation = unique("tenant"), unique("conv")
    first, second = turn(tenant, conversation, 1), turn(tenant, conversation, 2)
    corrected = first.model_copy(update={"text": "turn number 1, corrected: the ferry left at dawn"})
    (result,) = ingest(postgres, [records([first.to_bytes(), second.to_bytes(), corrected.to_bytes(),
                                           corrected.to_bytes(), second.to_bytes()])], embedder)
    assert result.outcomes == ["inserted", "inserted", "updated", "unchanged", "unchanged"]
    assert stored(db_url, tenant) == [("t001", corrected.text), ("t002", second.text)]
    with psycopg.connect(db_url) as conn:
        revisions = conn.execute("SELECT turn_id, revision FROM memory.turns WHERE tenant = %s ORDER BY turn_id",
                                 (tenant,)).fetchall()
        words = conn.execute("SELECT turns FROM memory.term_counts WHERE tenant = %s AND lexeme = 'ferri'",
                             (tenant,)).fetchall()
    assert revisions == [("t001", 2), ("t002", 1)]
    assert words == [(1,)]  # the BM25 word counts follow the last version, counted once


def test_the_outbox_marks_published_only_what_kafka_acknowledged(postgres, db_url, unique, embedder):
    from epistream.storage.db import create_pool

    tenant, conversation = unique("tenant"), unique("conv")
    (closing,) = ingest(postgres, [records([turn(tenant, conversation, 1).to_bytes(),
                                            close_request(tenant, conversation, "t001")])], embedder)
    sent: list[bytes] = []

    async def lost(key: bytes, value: bytes) -> None:
        raise TimeoutError("delivery expired: the broker was away")  # what the awaited future raises

    async def delivered(key: bytes, value: bytes) -> None:
        sent.append(key)

    async def go(send) -> int:  # type: ignore[no-untyped-def]
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            return await outbox.publish(pool, closing.closed_segments, send)
        finally:
            await pool.close()

    assert asyncio.run(go(lost)) == 0
    assert [row[4] for row in segments_of(db_url, tenant)] == [True]  # still in the outbox
    assert asyncio.run(go(delivered)) == 1 and sent == [conversation.encode()]
    assert [row[4] for row in segments_of(db_url, tenant)] == [False]


def test_pooled_connections_killed_by_the_server_are_replaced_not_handed_out(postgres, db_url):
    from epistream.storage.db import create_pool

    async def go() -> int:
        pool = create_pool(postgres.with_overrides(db_pool_min=2, db_pool_max=2))
        await pool.open(wait=True)
        try:
            with psycopg.connect(db_url, autocommit=True) as admin:  # what a PostgreSQL restart does to them
                killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                       " WHERE pid <> pg_backend_pid() AND datname = current_database()").fetchone()
            assert killed is not None and killed[0] >= 2
            async with pool.connection() as conn:
                return (await (await conn.execute("SELECT 1")).fetchone())[0]
        finally:
            await pool.close()

    assert asyncio.run(go()) == 1


def test_an_error_no_record_can_cause_holds_the_batch_until_it_clears_instead_of_dead_lettering_it(
        postgres, db_url, unique, embedder):
    """A lost privilege (or a missing table) would fail every record alike: the batch waits for the operator
    and is stored once the grant is back, with nothing dead-lettered."""
    from psycopg import sql

    from epistream.storage.db import APP_ROLE, create_pool

    tenant, conversation = unique("tenant"), unique("conv")
    grant = sql.Identifier(APP_ROLE)

    async def go() -> object:
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            with psycopg.connect(db_url, autocommit=True) as admin:
                admin.execute(sql.SQL("REVOKE INSERT ON memory.turns FROM {}").format(grant))
                try:
                    batch = asyncio.create_task(ingest_batch(
                        records([turn(tenant, conversation, 1).to_bytes()]), pool=pool, embedder=embedder,
                        metrics=Metrics.create(), segmenter=CONFIG, max_backoff_s=0.2))
                    await asyncio.sleep(3.0)
                    assert not batch.done(), "the batch gave up on an error that waiting can fix"
                finally:
                    admin.execute(sql.SQL("GRANT INSERT ON memory.turns TO {}").format(grant))
            return await asyncio.wait_for(batch, 60)
        finally:
            await pool.close()

    result = asyncio.run(go())
    assert result.dead == [] and result.outcomes == ["inserted"]
    assert [turn_id for turn_id, _ in stored(db_url, tenant)] == ["t001"]
