"""The fast path: validate turns, embed them, store them; dead-letter what is invalid.

A plain async function over a batch of raw records, so tests call it without
Faust; the agent in :mod:`pipeline.app` only decodes, calls, produces.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError

from epistream.contracts import DeadLetter, Turn
from epistream.embeddings import Embedder
from epistream.errors import ContractError
from epistream.kafka_io import count_dead_letter, dead_letter
from epistream.metrics import Metrics

from .records import RawRecord
from .turns_store import upsert_turns

log = logging.getLogger(__name__)

STAGE = "ingest"
# Errors where waiting helps: the offset is not committed, so nothing is lost.
_TRANSIENT = (psycopg.OperationalError, psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
# Errors tied to one row's content: find the row and dead-letter it.
_ROW_ERRORS = (psycopg.DataError, psycopg.IntegrityError)


@dataclass
class IngestResult:
    stored: list[Turn] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)


def decode_turn(record: RawRecord) -> Turn:
    try:
        return Turn.from_bytes(record.value)
    except (ValidationError, ValueError, UnicodeDecodeError) as exc:
        raise ContractError(f"not a valid memory.turns event: {_describe(exc)}") from exc


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()[:5])
    return str(exc)[:500]


async def ingest_batch(
    records: Sequence[RawRecord],
    *,
    pool: AsyncConnectionPool,
    embedder: Embedder,
    metrics: Metrics,
    max_backoff_s: float = 30.0,
) -> IngestResult:
    """Store every valid turn of the batch; return what was stored and what must be dead-lettered."""
    started = time.perf_counter()
    result = IngestResult()
    valid: list[tuple[Turn, RawRecord]] = []
    for record in records:
        try:
            valid.append((decode_turn(record), record))
        except ContractError as exc:
            result.dead.append(_letter(record, exc))
    if valid:
        embed_started = time.perf_counter()
        # ONNX Runtime releases the GIL: run it off the event loop.
        vectors = await asyncio.to_thread(embedder.embed, [t.text for t, _ in valid])
        metrics.embedding_seconds.observe(time.perf_counter() - embed_started)
        stored = await _store_with_retry(pool, valid, vectors, result, max_backoff_s)
        now = datetime.now(UTC)
        for _, record in stored:
            if record.produced_at is not None:
                metrics.produce_to_searchable_seconds.observe(max(0.0, (now - record.produced_at).total_seconds()))
    for outcome in result.outcomes:
        metrics.turns_ingested.labels(outcome).inc()
    for letter in result.dead:
        count_dead_letter(metrics, letter)
    metrics.ingest_batch_seconds.observe(time.perf_counter() - started)
    return result


async def _store_with_retry(pool, valid, vectors, result: IngestResult, max_backoff_s: float):  # type: ignore[no-untyped-def]
    attempt = 0
    while True:
        attempt += 1
        try:
            async with pool.connection() as conn:
                try:
                    outcomes = await upsert_turns(conn, [t for t, _ in valid], vectors, [r for _, r in valid])
                    result.stored.extend(t for t, _ in valid)
                    result.outcomes.extend(outcomes)
                    return valid
                except _ROW_ERRORS:
                    return await _store_one_by_one(conn, valid, vectors, result)
        except _TRANSIENT as exc:
            # Never skip: block this partition (backpressure) until PostgreSQL is back.
            delay = min(max_backoff_s, 0.5 * 2 ** min(attempt, 6)) * (0.5 + random.random() / 2)
            log.warning("storing %d turns failed (%s), retry %d in %.1fs", len(valid), type(exc).__name__, attempt, delay)
            await asyncio.sleep(delay)


async def _store_one_by_one(conn, valid, vectors, result: IngestResult):  # type: ignore[no-untyped-def]
    stored = []
    for (turn, record), vector in zip(valid, vectors, strict=True):
        try:
            outcomes = await upsert_turns(conn, [turn], vector[None, :], [record])
        except _ROW_ERRORS as exc:
            result.dead.append(_letter(record, exc))
            continue
        result.stored.append(turn)
        result.outcomes.extend(outcomes)
        stored.append((turn, record))
    return stored


def _letter(record: RawRecord, exc: Exception) -> DeadLetter:
    return dead_letter(
        topic=record.topic, partition=record.partition, offset=record.offset,
        key=record.key, value=record.value, stage=STAGE, error=exc,
    )
