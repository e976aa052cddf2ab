"""Segments on the real stack: boundaries and overlap written in the turns'
transaction, idle closes through Kafka, and replays that change nothing."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import psycopg
import pytest

from epistream.contracts.segments import Segment
from epistream.contracts.turns import Turn
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig

from .conftest import read_topic, wait_for
from .helpers import T0, produce_turns

pytestmark = pytest.mark.integration

SEGMENT_COLUMNS = "segment_id, seq, turn_ids, overlap_turns, close_reason, start_ts, end_ts, raw_text, token_estimate"


def _turns(tenant: str, conversation: str, n: int, *, session_every: int | None = None, words: int = 30) -> list[Turn]:
    return [
        Turn(
            tenant=tenant, conversation_id=conversation, turn_id=f"t{i:03d}", speaker="Ana" if i % 2 else "Ben",
            text=f"turn {i} " + " ".join(["words"] * words), ts=T0 + timedelta(minutes=i),
            session_id=f"s{i // session_every}" if session_every else "s0",
        )
        for i in range(n)
    ]


def _records(turns: list[Turn]) -> list[RawRecord]:
    now_ms = int(time.time() * 1000)
    return [RawRecord("memory.turns", 0, i, t.conversation_id.encode(), t.to_bytes(), now_ms)
            for i, t in enumerate(turns)]


def _ingest(postgres, turns: list[Turn], config: SegmenterConfig, batch: int = 5):
    from epistream.storage.db import create_pool

    embedder = Embedder.from_settings(postgres)

    async def go():
        pool = create_pool(postgres)
        await pool.open(wait=True)
        closed = []
        try:
            records = _records(turns)
            for i in range(0, len(records), batch):
                result = await ingest_batch(records[i:i + batch], pool=pool, embedder=embedder,
                                            metrics=Metrics.create(), segmenter=config)
                closed.extend(result.closed_segments)
        finally:
            await pool.close()
        return closed

    return asyncio.run(go())


def _segments(db_url: str, tenant: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            f"SELECT {SEGMENT_COLUMNS} FROM memory.segments WHERE tenant = %s ORDER BY seq", (tenant,)
        ).fetchall()


def test_budget_closes_segments_with_overlap_and_stores_them_whole(postgres, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    turns = _turns(tenant, conversation, 12)  # ~50 tokens each
    config = SegmenterConfig(max_tokens=200, overlap_share=0.3, max_gap=timedelta(hours=1))
    closed = _ingest(postgres, turns, config)
    rows = _segments(db_url, tenant)
    assert [sid for _, sid in closed] == [r[0] for r in rows]
    assert [r[4] for r in rows] == ["budget"] * len(rows) and len(rows) >= 3
    first, second = rows[0], rows[1]
    assert first[2][0] == "t000" and first[3] == 0 and first[8] >= 200
    # The second segment starts with the first one's last turn: the overlap.
    assert second[3] == 1 and second[2][0] == first[2][-1]
    # Stored whole: every turn's time, speaker and text, in order.
    lines = first[7].splitlines()
    assert len(lines) == len(first[2])
    assert lines[0].startswith(f"[{turns[0].ts:%Y-%m-%d %H:%M %z}]") and "Ben: turn 0 words" in lines[0]
    assert first[5] == turns[0].ts and first[6] == turns[len(first[2]) - 1].ts


def test_session_change_closes_a_segment_without_overlap(postgres, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    config = SegmenterConfig(max_tokens=10_000, overlap_share=0.3, max_gap=timedelta(hours=1))
    _ingest(postgres, _turns(tenant, conversation, 9, session_every=4), config)
    rows = _segments(db_url, tenant)
    assert [(r[2], r[3], r[4]) for r in rows] == [
        (["t000", "t001", "t002", "t003"], 0, "session"),
        (["t004", "t005", "t006", "t007"], 0, "session"),
    ]


def test_replaying_the_same_turns_creates_no_new_segments_and_an_empty_replay_matches(postgres, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    turns = _turns(tenant, conversation, 14, session_every=6)
    config = SegmenterConfig(max_tokens=150, overlap_share=0.3, max_gap=timedelta(hours=1))
    _ingest(postgres, turns, config)
    before = _segments(db_url, tenant)
    assert len(before) >= 3
    # Duplicates: nothing changes.
    assert _ingest(postgres, turns, config) == []
    assert _segments(db_url, tenant) == before
    # Empty the memory of this tenant and replay with other batch sizes: the same segments.
    with psycopg.connect(db_url) as conn:
        for table in ("segments", "segmenter_state", "turns"):
            conn.execute(f"DELETE FROM memory.{table} WHERE tenant = %s", (tenant,))
    _ingest(postgres, turns, config, batch=3)
    assert _segments(db_url, tenant) == before


def test_idle_conversation_closes_through_kafka_and_is_published(stack, db_url, unique):
    tenant, conversation = unique("tenant"), unique("conv")
    turns = _turns(tenant, conversation, 3, words=5)
    produce_turns(stack, turns)
    # The worker's idle timeout is 3 s in the test stack.
    rows = wait_for(lambda: _segments(db_url, tenant), timeout=60, what="idle segment")
    assert rows[0][4] == "idle" and rows[0][2] == ["t000", "t001", "t002"]

    def ours(key, value):
        return key == conversation.encode()

    published = asyncio.run(read_topic(stack, stack.topic_segments, ours))
    segment = Segment.from_bytes(published[0].value)
    assert segment.segment_id == rows[0][0] and segment.close_reason == "idle"
    assert [t.turn_id for t in segment.turns] == ["t000", "t001", "t002"]
    assert segment.turns[0].text == turns[0].text and segment.produced_at is not None
    with psycopg.connect(db_url) as conn:
        (published_at,) = conn.execute(
            "SELECT published_at FROM memory.segments WHERE tenant = %s", (tenant,)).fetchone()
    assert published_at is not None
