"""``read_segment``: a segment's raw text, summary and turns, for an assistant read."""

from __future__ import annotations

from psycopg import AsyncConnection, sql

from .results import SegmentRead, TurnHit
from .sql import TURN_COLUMNS, conversations, in_conversations, rows

READ_SEGMENT = sql.SQL("""
SELECT s.segment_id, s.conversation_id, s.seq, s.start_ts, s.end_ts, s.summary, s.raw_text, s.status, s.turn_ids
FROM memory.segments s
WHERE s.tenant = %(tenant)s AND s.segment_id = %(segment_id)s AND {conversations}
""").format(conversations=in_conversations("s"))

# The segment's turns in the segment's own order.
SEGMENT_TURNS = sql.SQL("""
SELECT {turn_columns}
FROM unnest(%(turn_ids)s::text[]) WITH ORDINALITY AS ids(turn_id, position)
JOIN memory.turns t ON t.tenant = %(tenant)s AND t.conversation_id = %(conversation_id)s AND t.turn_id = ids.turn_id
ORDER BY ids.position
""").format(turn_columns=TURN_COLUMNS)


async def read_segment(
    conn: AsyncConnection,
    *,
    tenant: str,
    segment_id: str,
    conversation_ids: list[str] | None = None,
) -> SegmentRead | None:
    """A segment's raw text, summary and turns (in segment order); None if unknown or out of scope."""
    found = await rows(conn, READ_SEGMENT, {"tenant": tenant, "segment_id": segment_id,
                                            "conversations": conversations(conversation_ids)})
    if not found:
        return None
    row = found[0]
    turns = await rows(conn, SEGMENT_TURNS, {"tenant": tenant, "conversation_id": row["conversation_id"],
                                             "turn_ids": list(row["turn_ids"])})
    return SegmentRead(
        segment_id=row["segment_id"], conversation_id=row["conversation_id"], seq=row["seq"],
        start_ts=row["start_ts"], end_ts=row["end_ts"], status=row["status"], summary=row["summary"],
        raw_text=row["raw_text"], turns=[TurnHit.from_row(r) for r in turns],
    )
