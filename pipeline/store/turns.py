"""Idempotent writes of turns (with embeddings) into ``memory.turns``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import numpy as np
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from epistream.contracts.turns import Turn
from epistream.models.embeddings import TURN_EMBEDDING_VERSION

from ..records import RawRecord

# Keyed by (tenant, conversation, turn): a replay or a duplicate produce is a
# no-op; a corrected turn replaces the old version (its revision counts the versions: a partitioned
# table cannot return xmax, which told an insert from an update before sql/014).
UPSERT_TURN = """
INSERT INTO memory.turns AS t (
    tenant, conversation_id, turn_id, speaker, text, ts, tz_offset_s, session_id, metadata,
    embedding, embedded_as, kafka_partition, kafka_offset, produced_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
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
RETURNING t.revision = 1 AS inserted
"""


def local_time(ts: datetime, tz_offset_s: int) -> datetime:
    """A stored instant back in the speaker's own UTC offset."""
    return ts.astimezone(timezone(timedelta(seconds=tz_offset_s)))


def _params(turn: Turn, vector: np.ndarray, record: RawRecord) -> tuple:
    return (
        turn.tenant, turn.conversation_id, turn.turn_id, turn.speaker, turn.text, turn.ts,
        int(turn.ts.utcoffset().total_seconds()),  # type: ignore[union-attr]  # aware by contract
        turn.session_id, Jsonb(turn.metadata), vector, TURN_EMBEDDING_VERSION, record.partition, record.offset,
        record.produced_at,
    )


async def upsert_turns(
    conn: AsyncConnection, turns: Sequence[Turn], vectors: np.ndarray, records: Sequence[RawRecord]
) -> list[str]:
    """Write turns in one transaction; return each one's outcome: inserted, updated or unchanged."""
    outcomes: list[str] = []
    if not turns:
        return outcomes
    async with conn.transaction(), conn.cursor() as cur:
        await cur.executemany(
            UPSERT_TURN,
            [_params(t, v, r) for t, v, r in zip(turns, vectors, records, strict=True)],
            returning=True,
        )
        while True:
            row = await cur.fetchone()
            outcomes.append("unchanged" if row is None else ("inserted" if row[0] else "updated"))
            if not cur.nextset():
                break
    return outcomes
