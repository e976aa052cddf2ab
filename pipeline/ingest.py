"""The fast path: validate turns, embed them, store them, advance the segmenter;
set aside what is invalid, with why.

A plain async function over a batch of raw records, so tests call it without
Faust; the agent in :mod:`pipeline.app` calls it, dead-letters what it set aside, produces.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from epistream.contracts import SegmentCloseRequest, Turn, decode
from epistream.db import tenant_scope
from epistream.embeddings import Embedder
from epistream.errors import ContractError
from epistream.metrics import Metrics
from epistream.retry import BLOCKING, retry

from .records import RawRecord
from .segmenter import SegmenterConfig
from .store import segments
from .store.tombstones import guard, is_forgotten
from .store.turns import upsert_turns

log = logging.getLogger(__name__)

STAGE = "ingest"
# Errors tied to one row's content: find the row and dead-letter it.
_ROW_ERRORS = (psycopg.DataError, psycopg.IntegrityError)


@dataclass(frozen=True)
class Rejected:
    """A record the batch cannot use, and why: the caller dead-letters it at STAGE."""

    record: RawRecord
    error: Exception


@dataclass
class IngestResult:
    stored: list[Turn] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    dead: list[Rejected] = field(default_factory=list)
    closed_segments: list[tuple[str, str]] = field(default_factory=list)


def decode_record(record: RawRecord) -> Turn | SegmentCloseRequest:
    """A turn, or a segment-close control record; anything else is a ContractError."""
    return decode(record.value, (Turn, SegmentCloseRequest), what="memory.turns event")


async def ingest_batch(
    records: Sequence[RawRecord],
    *,
    pool: AsyncConnectionPool,
    embedder: Embedder,
    metrics: Metrics,
    segmenter: SegmenterConfig | None = None,
    max_backoff_s: float = 30.0,
) -> IngestResult:
    """Store every valid turn of the batch and advance the segmenter (when given)."""
    started = time.perf_counter()
    result = IngestResult()
    turns: list[tuple[Turn, RawRecord]] = []
    closes: list[SegmentCloseRequest] = []
    for record in records:
        try:
            decoded = decode_record(record)
        except ContractError as exc:
            result.dead.append(Rejected(record, exc))
            continue
        if isinstance(decoded, SegmentCloseRequest):
            closes.append(decoded)
        else:
            turns.append((decoded, record))
    vectors = np.zeros((0, 384), dtype=np.float32)
    if turns:
        embed_started = time.perf_counter()
        # ONNX Runtime releases the GIL: run it off the event loop.
        vectors = await asyncio.to_thread(embedder.embed, [t.text for t, _ in turns])
        metrics.embedding_seconds.observe(time.perf_counter() - embed_started)
    if turns or (closes and segmenter is not None):
        await _store_with_retry(pool, turns, vectors, closes, segmenter, result, max_backoff_s)
        now = datetime.now(UTC)
        stored_ids = {id(t) for t in result.stored}
        for turn, record in turns:
            if id(turn) in stored_ids and record.produced_at is not None:
                metrics.produce_to_searchable_seconds.observe(max(0.0, (now - record.produced_at).total_seconds()))
    for outcome in result.outcomes:
        metrics.turns_ingested.labels(outcome).inc()
    if result.closed_segments:
        metrics.segments_closed.inc(len(result.closed_segments))
    metrics.ingest_batch_seconds.observe(time.perf_counter() - started)
    return result


async def _store_with_retry(pool, turns, vectors, closes, segmenter, result: IngestResult, max_backoff_s: float):  # type: ignore[no-untyped-def]
    async def attempt() -> IngestResult:
        # Each attempt starts from the batch's decoding rejects: a failed one leaves nothing behind.
        partial = IngestResult(dead=list(result.dead))
        async with pool.connection() as conn:
            await _write(conn, turns, vectors, closes, segmenter, partial)
        return partial

    def waiting(exc: BaseException, attempt_no: int, delay: float) -> None:
        log.warning("storing %d turns failed (%s), retry %d in %.1fs", len(turns), type(exc).__name__, attempt_no, delay)

    # Never skip: block this partition (backpressure) until PostgreSQL is back.
    done = await retry(attempt, backoff=replace(BLOCKING, cap_s=max_backoff_s), on_retry=waiting)
    result.stored, result.outcomes = done.stored, done.outcomes
    result.dead, result.closed_segments = done.dead, done.closed_segments


async def _write(conn: AsyncConnection, turns, vectors, closes, segmenter, result: IngestResult) -> None:  # type: ignore[no-untyped-def]
    """Per tenant, one transaction under that tenant's row-level security: the
    turns (minus forgotten conversations), then the segmenter over the new ones."""
    for tenant in sorted({t.tenant for t, _ in turns} | {c.tenant for c in closes}):
        index = [i for i, (t, _) in enumerate(turns) if t.tenant == tenant]
        async with tenant_scope(conn, tenant):
            # Holds off a concurrent forget of these conversations until this transaction commits.
            forgotten = await guard(conn, tenant, [turns[i][0].conversation_id for i in index]
                                    + [c.conversation_id for c in closes if c.tenant == tenant])
            kept = [i for i in index if not is_forgotten(forgotten, turns[i][0].conversation_id)]
            result.outcomes.extend("tombstoned" for _ in range(len(index) - len(kept)))
            mine = [turns[i] for i in kept]
            stored, outcomes = await _upsert(conn, mine, vectors[kept] if kept else vectors[:0], result)
            result.stored.extend(stored)
            result.outcomes.extend(outcomes)
            if segmenter is None:
                continue
            inserted = [t for t, o in zip(stored, outcomes, strict=True) if o == "inserted"]
            result.closed_segments.extend(await segments.advance(conn, inserted, segmenter))
            for request in closes:
                if request.tenant == tenant and not is_forgotten(forgotten, request.conversation_id):
                    result.closed_segments.extend(await segments.close_if_idle(
                        conn, tenant, request.conversation_id, request.after_turn_id, segmenter))


async def _upsert(conn: AsyncConnection, turns, vectors, result: IngestResult) -> tuple[list[Turn], list[str]]:  # type: ignore[no-untyped-def]
    try:
        async with conn.transaction():  # a savepoint: a bad row must not void the others
            outcomes = await upsert_turns(conn, [t for t, _ in turns], vectors, [r for _, r in turns])
        return [t for t, _ in turns], outcomes
    except _ROW_ERRORS:
        return await _upsert_one_by_one(conn, turns, vectors, result)


async def _upsert_one_by_one(conn: AsyncConnection, turns, vectors, result: IngestResult):  # type: ignore[no-untyped-def]
    stored: list[Turn] = []
    outcomes: list[str] = []
    for (turn, record), vector in zip(turns, vectors, strict=True):
        try:
            async with conn.transaction():
                outcomes.extend(await upsert_turns(conn, [turn], vector[None, :], [record]))
        except _ROW_ERRORS as exc:
            result.dead.append(Rejected(record, exc))
            continue
        stored.append(turn)
    return stored, outcomes
