"""Idempotent writes of turns (with embeddings) into ``memory.turns``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from epistream.contracts.turns import Turn
from epistream.models.embeddings import TURN_EMBEDDING_VERSION

from ..records import RawRecord

# Keyed by (tenant, conversation, turn): a replay or a duplicate produce is a no-op; a corrected turn
# replaces the old version (its revision counts the versions: a partitioned table cannot return xmax,
# which told an insert from an update before sql/014).
#
# One statement for a whole run of turns, its columns as arrays: memory.turns' statement triggers (the
# BM25 word counts, sql/015) then fire once a run, not once a turn, and the rows go in one executor pass
# (storing the development split: 1.9 ms a turn with a statement per turn, about 1.35 so, of which the
# HNSW insert is about 0.8; docs/benchmarks/ingest-enrich.md).
UPSERT_TURNS = """
INSERT INTO memory.turns AS t (
    tenant, conversation_id, turn_id, speaker, text, ts, tz_offset_s, session_id, metadata,
    embedding, embedded_as, kafka_partition, kafka_offset, produced_at)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::timestamptz[],
                     %s::integer[], %s::text[], %s::jsonb[], %b::vector[], %s::smallint[], %s::integer[],
                     %s::bigint[], %s::timestamptz[])
ON CONFLICT (tenant, conversation_id, turn_id) DO UPDATE SET
    speaker = EXCLUDED.speaker, text = EXCLUDED.text, ts = EXCLUDED.ts, tz_offset_s = EXCLUDED.tz_offset_s,
    session_id = EXCLUDED.session_id, metadata = EXCLUDED.metadata,
    embedding = EXCLUDED.embedding, embedded_as = EXCLUDED.embedded_as, embedded_by = EXCLUDED.embedded_by,
    kafka_partition = EXCLUDED.kafka_partition,
    kafka_offset = EXCLUDED.kafka_offset, produced_at = EXCLUDED.produced_at,
    stored_at = now(), revision = t.revision + 1
WHERE (t.speaker, t.text, t.ts, t.tz_offset_s, t.session_id, t.metadata)
      IS DISTINCT FROM (EXCLUDED.speaker, EXCLUDED.text, EXCLUDED.ts, EXCLUDED.tz_offset_s, EXCLUDED.session_id,
                        EXCLUDED.metadata)
RETURNING t.tenant, t.conversation_id, t.turn_id, t.revision = 1 AS inserted
"""

Key = tuple[str, str, str]


def local_time(ts: datetime, tz_offset_s: int) -> datetime:
    """A stored instant back in the speaker's own UTC offset."""
    return ts.astimezone(timezone(timedelta(seconds=tz_offset_s)))


def _key(turn: Turn) -> Key:
    return turn.tenant, turn.conversation_id, turn.turn_id


def _columns(turns: Sequence[Turn], vectors: Sequence[np.ndarray], records: Sequence[RawRecord]) -> list[list]:
    """The statement's parameters: one array per column, in UPSERT_TURNS' order."""
    return [
        [t.tenant for t in turns], [t.conversation_id for t in turns], [t.turn_id for t in turns],
        # In UTC: an array goes as text, and PostgreSQL's text input refuses offsets beyond 15:59 that a turn
        # may carry (+23:59 is valid ISO 8601); its own offset is stored beside it.
        [t.speaker for t in turns], [t.text for t in turns], [t.ts.astimezone(UTC) for t in turns],
        [int(t.ts.utcoffset().total_seconds()) for t in turns],  # type: ignore[union-attr]  # aware by contract
        [t.session_id for t in turns], [Jsonb(t.metadata) for t in turns], list(vectors),
        [TURN_EMBEDDING_VERSION] * len(turns), [r.partition for r in records], [r.offset for r in records],
        [None if r.produced_at is None else r.produced_at.astimezone(UTC) for r in records],
    ]


def distinct_runs(turns: Sequence[Turn]) -> Iterator[range]:
    """The turns cut, in order, into runs where no turn is there twice: one statement cannot write a row
    twice (PostgreSQL refuses), and a turn sent twice in a batch is written as it came, first then second."""
    start, seen = 0, set[Key]()
    for n, turn in enumerate(turns):
        key = _key(turn)
        if key in seen:
            yield range(start, n)
            start, seen = n, set()
        seen.add(key)
    if start < len(turns):
        yield range(start, len(turns))


async def upsert_turns(
    conn: AsyncConnection, turns: Sequence[Turn], vectors: Sequence[np.ndarray], records: Sequence[RawRecord]
) -> list[str]:
    """Write turns in one transaction; return each one's outcome, in order: inserted, updated or unchanged."""
    outcomes: list[str] = []
    if not turns:
        return outcomes
    async with conn.transaction(), conn.cursor() as cur:
        for run in distinct_runs(turns):
            part = turns[run.start:run.stop]
            await cur.execute(UPSERT_TURNS, _columns(part, vectors[run.start:run.stop], records[run.start:run.stop]))
            written = {(r[0], r[1], r[2]): bool(r[3]) for r in await cur.fetchall()}
            # A row the statement left as it was (the same content again) returns nothing: unchanged.
            outcomes += ["unchanged" if (k := _key(t)) not in written else ("inserted" if written[k] else "updated")
                         for t in part]
    return outcomes
