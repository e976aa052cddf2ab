"""The fast path: validate turns, embed them, store them, advance the segmenter;
set aside what is invalid or cannot be stored, with why.

A plain async function over a batch of raw records, so tests call it without
Faust; the agent in :mod:`epistream.pipeline.app` calls it through its
:class:`epistream.pipeline.checkpoint.Checkpoint`, which dead-letters what it set
aside, publishes what it closed, and only then acknowledges the batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar

import numpy as np
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from epistream.contracts.decoding import decode
from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.core import tracing
from epistream.core.claims import ClaimCheck
from epistream.core.metrics import Metrics
from epistream.core.retry import BLOCKING, retry
from epistream.models.embeddings import DIMENSIONS, Embedder, turn_embedding_text
from epistream.storage.db import tenant_scope
from epistream.storage.watermarks import advance, runs_of

from .records import RawRecord
from .segmenter import SegmenterConfig
from .store import events, segments
from .store.tombstones import guard, is_forgotten
from .store.turns import upsert_turns

log = logging.getLogger(__name__)

STAGE = "ingest"

T = TypeVar("T")


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
    #: (tenant, conversation_id) -> the trace its latest record carried (tracing on only): where the
    #: record of a segment the batch closed continues from.
    origins: dict[tuple[str, str], object] = field(default_factory=dict)
    #: (topic, partition, offset) of each record a committed transaction covered in the watermark.
    covered: set[tuple[str, int, int]] = field(default_factory=set)


def decode_record(record: RawRecord, claims: ClaimCheck | None = None) -> Turn | SegmentCloseRequest:
    """A turn, or a segment-close control record, whose tenant claim `claims` verifies; anything else
    is a ContractError, or a ClaimRejected saying why the claim is not proven."""
    decoded = decode(record.value, (Turn, SegmentCloseRequest), what="memory.turns event")
    if claims is not None:
        claims.verify(decoded.tenant, record.value or b"", record.headers)
    return decoded


#: A batch item in partition order: the record and what it decoded to.
Item = tuple[RawRecord, Turn | SegmentCloseRequest]


#: Turns embedded and written per transaction when the caller names no chunk size: EPISTREAM_INGEST_CHUNK's
#: default, the default batch (one transaction, no overlap), which measured fastest on 2 cores.
DEFAULT_CHUNK_TURNS = 128


async def ingest_batch(
    records: Sequence[RawRecord],
    *,
    pool: AsyncConnectionPool,
    embedder: Embedder,
    metrics: Metrics,
    segmenter: SegmenterConfig | None = None,
    max_backoff_s: float = 30.0,
    chunk_turns: int = DEFAULT_CHUNK_TURNS,
    claims: ClaimCheck | None = None,
) -> IngestResult:
    """Store every valid turn of the batch and apply it to the segmenter (when given), strictly in
    partition order; return what was stored and what is to be dead-lettered, with why.

    The batch is cut into chunks of `chunk_turns` turns, each written in its own transaction while
    the next one is embedded (the embedder and PostgreSQL then share the cores instead of taking
    turns); a chunk is written only after the one before it committed.

    The one failure policy: a transient error (the database away, a lost race) is retried, blocking
    the partition until it works; any other error isolates the records that cause it: the failed
    chunk is stored again record by record, and each record that still fails on its own is set aside
    with its error (chunks already committed stay as they are). So nothing raises out of here but a
    cancel, and every record ends stored or rejected. With `claims`, a record whose tenant claim is not
    proven is rejected before anything of it is stored."""
    started = time.perf_counter()
    result = IngestResult()
    items: list[Item] = []
    for record in records:
        try:
            items.append((record, decode_record(record, claims)))
        except Exception as exc:  # ContractError with its reason; anything else is still this record's
            result.dead.append(Rejected(record, exc))
    result.origins = tracing.origins_of((t.tenant, t.conversation_id, r.headers) for r, t in items)
    store = _Store(pool, embedder, metrics, segmenter, max_backoff_s)
    await store.chunks(split_chunks(items, chunk_turns), result)
    # The records set aside (unusable, or failing on their own) are done with too: one more commit
    # covers them in the watermark, or their offsets would be a gap that holds the mark for good.
    await store.cover({(r.topic, r.partition, r.offset) for r in records} - result.covered, result)
    result.dead.sort(key=lambda r: r.record.offset)
    _observe(metrics, result, [(t, r) for r, t in items if isinstance(t, Turn)])
    metrics.ingest_batch_seconds.observe(time.perf_counter() - started)
    return result


def split_chunks(items: list[Item], chunk_turns: int) -> list[list[Item]]:
    """Consecutive slices of the batch holding at most `chunk_turns` turns each; a control record
    stays exactly where it stands between the turns around it."""
    if chunk_turns < 1:
        raise ValueError("chunk_turns must be at least 1")
    chunks: list[list[Item]] = [[]]
    turns = 0
    for item in items:
        if isinstance(item[1], Turn):
            if turns == chunk_turns:
                chunks.append([])
                turns = 0
            turns += 1
        chunks[-1].append(item)
    return [c for c in chunks if c]


def _observe(metrics: Metrics, result: IngestResult, turns: list[tuple[Turn, RawRecord]]) -> None:
    now = datetime.now(UTC)
    stored_ids = {id(t) for t in result.stored}
    for turn, record in turns:
        if id(turn) in stored_ids and record.produced_at is not None:
            metrics.produce_to_searchable_seconds.observe(max(0.0, (now - record.produced_at).total_seconds()))
    for outcome in result.outcomes:
        metrics.turns_ingested.labels(outcome).inc()
    if result.closed_segments:
        metrics.segments_closed.inc(len(result.closed_segments))


def _turns(items: list[Item]) -> list[Turn]:
    return [t for _, t in items if isinstance(t, Turn)]


Vectors = asyncio.Task[np.ndarray]


@dataclass(frozen=True)
class _Store:
    """What storing a batch needs, so the steps below stay small."""

    pool: AsyncConnectionPool
    embedder: Embedder
    metrics: Metrics
    segmenter: SegmenterConfig | None
    max_backoff_s: float

    async def chunks(self, chunks: list[list[Item]], result: IngestResult) -> None:
        """Chunk k is written while chunk k+1 is embedded: the next embedding starts once this
        chunk's vectors are in (two at once would only split the cores between them)."""
        upcoming = self._embedding(chunks[0]) if chunks else None
        try:
            for k, chunk in enumerate(chunks):
                current, upcoming = upcoming, None
                assert current is not None
                vectors = await _outcome(current)
                upcoming = self._embedding(chunks[k + 1]) if k + 1 < len(chunks) else None
                await self.chunk(chunk, vectors, result)
        finally:
            # A cancel (or anything else) mid-batch: the next chunk's embedding is abandoned, its
            # thread finishes on its own and nobody reads what it computed.
            _abandon(upcoming)

    async def chunk(self, items: list[Item], vectors: np.ndarray | Exception, result: IngestResult) -> None:
        try:
            if isinstance(vectors, Exception):
                raise vectors
            with tracing.span("store turns", attributes={"epistream.records": len(items)}):
                await self.commit(items, vectors, result)
        except Exception as exc:
            log.warning("chunk of %d records failed (%s: %s): storing them one by one", len(items),
                        type(exc).__name__, str(exc)[:200])
            await self.one_by_one(items, result)

    async def one_by_one(self, items: list[Item], result: IngestResult) -> None:
        for item in items:
            try:
                await self.commit([item], await self.embed(_turns([item])), result)
            except Exception as one:
                result.dead.append(Rejected(item[0], one))

    def _embedding(self, items: list[Item]) -> Vectors:
        return asyncio.ensure_future(self.embed(_turns(items)))

    async def embed(self, turns: list[Turn]) -> np.ndarray:
        if not turns:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        embed_started = time.perf_counter()
        # ONNX Runtime releases the GIL: run it off the event loop.
        with tracing.span("embed turns", attributes={"epistream.turns": len(turns)}):
            vectors = await asyncio.to_thread(self.embedder.embed,
                                              [turn_embedding_text(t.speaker, t.text, t.ts) for t in turns])
        self.metrics.embedding_seconds.observe(time.perf_counter() - embed_started)
        return vectors

    async def cover(self, offsets: set[tuple[str, int, int]], result: IngestResult) -> None:
        """Add `offsets` (topic, partition, offset) to the watermark in a transaction of their own."""
        if offsets:
            await self._transaction(lambda conn: advance(conn, runs_of(offsets)), f"marking {len(offsets)} records done")
            result.covered |= offsets

    async def commit(self, items: list[Item], vectors: np.ndarray, result: IngestResult) -> None:
        """Write the items in one transaction, with their offsets in the watermark, and add what was
        written to `result` only once it is committed."""
        if not items:
            return
        turns = _turns(items)
        vector_of = {id(t): v for t, v in zip(turns, vectors, strict=True)}
        offsets = {(r.topic, r.partition, r.offset) for r, _ in items}

        async def write(conn: AsyncConnection) -> IngestResult:
            done = IngestResult()
            if turns or self.segmenter is not None:
                await _write(conn, items, vector_of, self.segmenter, done)
            # Last, so the watermark rows stay locked only for the commit.
            await advance(conn, runs_of(offsets))
            return done

        done = await self._transaction(write, f"storing {len(turns)} turns")
        result.stored.extend(done.stored)
        result.outcomes.extend(done.outcomes)
        result.closed_segments.extend(done.closed_segments)
        result.covered |= offsets

    async def _transaction(self, write: Callable[[AsyncConnection], Awaitable[T]], what: str) -> T:
        """`write` in one transaction, retried while transient: a failed attempt leaves nothing of it
        behind. Never skipped: the partition blocks (backpressure) until PostgreSQL is back."""

        async def attempt() -> T:
            async with self.pool.connection() as conn, conn.transaction():
                return await write(conn)

        def waiting(exc: BaseException, attempt_no: int, delay: float) -> None:
            log.warning("%s failed (%s), retry %d in %.1fs", what, type(exc).__name__, attempt_no, delay)

        return await retry(attempt, backoff=replace(BLOCKING, cap_s=self.max_backoff_s), on_retry=waiting)


async def _outcome(task: Vectors) -> np.ndarray | Exception:
    """The chunk's vectors, or the error embedding it raised (the chunk's to isolate); a cancel propagates."""
    try:
        return await task
    except Exception as exc:
        return exc


def _abandon(task: Vectors | None) -> None:
    if task is None:
        return
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()  # looked at, so an unused failure is not reported as lost


async def _write(conn: AsyncConnection, items: list[Item], vector_of: dict[int, np.ndarray],
                 segmenter: SegmenterConfig | None, result: IngestResult) -> None:
    """Per tenant, under that tenant's row-level security: its records in partition order, turns
    (minus forgotten conversations) in runs up to each close request, so a close is applied exactly
    where it stands in the partition, whatever the batch boundaries."""
    for tenant in sorted({t.tenant for _, t in items}):
        async with tenant_scope(conn, tenant):
            # Holds off a concurrent forget of these conversations until this transaction commits.
            forgotten = await guard(conn, tenant, [t.conversation_id for _, t in items if t.tenant == tenant])
            run: list[tuple[Turn, RawRecord]] = []
            written: list[tuple[Turn, RawRecord, str]] = []
            closed_before = len(result.closed_segments)
            for record, decoded in (i for i in items if i[1].tenant == tenant):
                if isinstance(decoded, Turn):
                    if is_forgotten(forgotten, decoded.conversation_id):
                        result.outcomes.append("tombstoned")
                    else:
                        run.append((decoded, record))
                    continue
                written += await _write_turns(conn, run, vector_of, segmenter, result)
                run = []
                if segmenter is not None and not is_forgotten(forgotten, decoded.conversation_id):
                    result.closed_segments.extend(await segments.close_if_idle(
                        conn, tenant, decoded.conversation_id, decoded.after_turn_id, segmenter))
            written += await _write_turns(conn, run, vector_of, segmenter, result)
            # Announced in this transaction: the events exist exactly when what they announce committed.
            await events.add(conn, await events.turns_stored(conn, tenant, written))
            await events.add(conn, await events.segments_closed(
                conn, tenant, [sid for _, sid in result.closed_segments[closed_before:]]))


async def _write_turns(conn: AsyncConnection, run: list[tuple[Turn, RawRecord]], vector_of: dict[int, np.ndarray],
                       segmenter: SegmenterConfig | None, result: IngestResult) -> list[tuple[Turn, RawRecord, str]]:
    """Store a run of turns and advance their segmenters; return each turn with its record and outcome."""
    if not run:
        return []
    turns = [t for t, _ in run]
    outcomes = await upsert_turns(conn, turns, [vector_of[id(t)] for t in turns], [r for _, r in run])
    result.stored.extend(turns)
    result.outcomes.extend(outcomes)
    written = [(t, r, o) for (t, r), o in zip(run, outcomes, strict=True)]
    if segmenter is None:
        return written
    inserted = [t for t, o in zip(turns, outcomes, strict=True) if o == "inserted"]
    result.closed_segments.extend(await segments.advance(conn, inserted, segmenter))
    # A corrected turn (same id, new content) of a closed segment: that segment is rebuilt and
    # goes back through the outbox to be enriched again.
    corrected = [t for t, o in zip(turns, outcomes, strict=True) if o == "updated"]
    result.closed_segments.extend(await segments.rebuild_containing(conn, corrected))
    return written
