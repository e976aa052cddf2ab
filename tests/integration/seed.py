"""Seeding memory through the real enrichment code, with a scripted model's known output."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta, timezone

from epistream.contracts.segments import Segment, SegmentTurn
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.models.llm import ModelClient, create_client
from epistream.pipeline.enrich import EnrichDeps, enrich_segment
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.storage.db import create_pool, tenant_scope
from epistream.testing.scripted_llm import ScriptedLLM

from .helpers import make_turns

TZ = timezone(timedelta(hours=1))
DIALOGUE = [
    ("Alice", "I moved to Lisbon last Wednesday, the flat is tiny but bright."),
    ("Bob", "Congratulations! Weren't you in Porto for years?"),
    ("Alice", "Yes, I lived in Porto from 2019 until this month."),
    ("Bob", "I adopted a dog two weeks ago, his name is Rex."),
    ("Alice", "I adopted a cat three weeks ago, her name is Miso."),
]
KNOWN_OUTPUT = {
    "summary": "Alice moved from Porto to Lisbon; Bob adopted Rex and Alice adopted Miso.",
    "gists": [
        {"text": "Alice moved to Lisbon.", "date": "last Wednesday", "turn_ids": ["t001"]},
        {"text": "Bob adopted a dog named Rex.", "date": "2024-03-04", "turn_ids": ["t004"]},
        {"text": "Alice adopted a cat named Miso.", "date": "2024-02-26", "turn_ids": ["t005"]},
        # A near-paraphrase of the second gist, as models write: it must get a SIMILAR edge.
        {"text": "Bob adopted a puppy called Rex.", "date": "two weeks ago", "turn_ids": ["t004"]},
    ],
    "facts": [
        {"subject": "Alice", "predicate": "lives in", "object": "Porto", "start_time": "2019",
         "end_time": "2024-03", "turn_ids": ["t003"]},
        {"subject": "I", "predicate": "lives_in", "object": "Lisbon", "start_time": "last Wednesday",
         "turn_ids": ["t001"]},
        {"subject": "Bob", "predicate": "adopted", "object": "Rex", "point_in_time": "two weeks ago",
         "turn_ids": ["t004"]},
        {"subject": "Alice", "predicate": "adopted", "object": "Miso", "point_in_time": "2024-02-26",
         "turn_ids": ["t005"]},
    ],
}


def seed_segment(tenant: str, conversation: str) -> Segment:
    turns = make_turns(tenant, conversation, DIALOGUE, start=datetime(2024, 3, 18, 20, 0, tzinfo=TZ))
    return Segment(
        tenant=tenant, conversation_id=conversation, segment_id=f"{conversation}#0000", seq=0,
        close_reason="session", overlap_turns=0, token_estimate=100,
        turns=[SegmentTurn(turn_id=t.turn_id, speaker=t.speaker, text=t.text, ts=t.ts) for t in turns],
        produced_at=datetime.now(UTC),
    ), turns


def run_enrichment(settings, base_url: str, segment: Segment, turns, *, retries: int = 2, segment_row: bool = True):
    """Store the segment's turns and (unless told not to, as if it had been forgotten) its segment row,
    as the ingest worker does, then enrich it."""
    embedder = Embedder.from_settings(settings)
    metrics = Metrics.create()

    async def go():
        pool = create_pool(settings)
        await pool.open(wait=True)
        try:
            records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), None) for i, t in enumerate(turns)]
            await ingest_batch(records, pool=pool, embedder=embedder, metrics=metrics,
                               segmenter=SegmenterConfig(max_tokens=10_000))
            if not segment_row:  # no model client: a call would fail the test
                return await enrich_segment(segment, EnrichDeps(settings, pool, embedder, None, metrics))
            async with pool.connection() as conn, tenant_scope(conn, segment.tenant):
                await conn.execute(
                    "INSERT INTO memory.segments (tenant, conversation_id, segment_id, seq, turn_ids, start_ts, end_ts,"
                    " raw_text, token_estimate, close_reason) VALUES (%s, %s, %s, 0, %s, %s, %s, 'raw', 100, 'session')"
                    " ON CONFLICT DO NOTHING",
                    (segment.tenant, segment.conversation_id, segment.segment_id, [t.turn_id for t in turns],
                     turns[0].ts, turns[-1].ts),
                )
            extractor = ModelClient(create_client(settings, base_url=base_url, timeout_s=settings.extractor_timeout_s),
                                    role="extractor",
                                    model=settings.llm_model, json_mode=settings.llm_json_mode, metrics=metrics,
                                    max_retries=retries, backoff_s=0.01)
            return await enrich_segment(segment, EnrichDeps(settings, pool, embedder, extractor, metrics))
        finally:
            await pool.close()

    return asyncio.run(go()), metrics


def scripted_reply(body: dict) -> tuple[int, str]:
    return 200, json.dumps(KNOWN_OUTPUT)



def seed_memory(settings, tenant: str, conversation: str) -> None:
    """Turns, a segment, gists, facts, entities and the graph, from KNOWN_OUTPUT."""
    segment, turns = seed_segment(tenant, conversation)
    with ScriptedLLM(scripted_reply) as server:
        outcome, _ = run_enrichment(settings, server.base_url, segment, turns)
    assert outcome.enriched, outcome.error
