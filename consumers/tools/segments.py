"""``read_segment``: a segment's raw text, summary and turns, for an assistant read."""

from __future__ import annotations

from psycopg import AsyncConnection, sql

from ..retrieval import load_turns
from ..retrieval.execute import rows
from ..retrieval.fragments import conversations, in_scope
from .results import SegmentRead, TurnHit

READ_SEGMENT = sql.SQL("""
SELECT s.segment_id, s.conversation_id, s.seq, s.start_ts, s.end_ts, s.summary, s.raw_text, s.status, s.turn_ids
FROM memory.segments s
WHERE {scope} AND s.segment_id = %(segment_id)s
""").format(scope=in_scope("s"))


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
    # The segment's turns in the segment's own order.
    turns = await load_turns(conn, tenant=tenant, conversation_id=row["conversation_id"], turn_ids=row["turn_ids"],
                             order="listed")
    return SegmentRead(
        segment_id=row["segment_id"], conversation_id=row["conversation_id"], seq=row["seq"],
        start_ts=row["start_ts"], end_ts=row["end_ts"], status=row["status"], summary=row["summary"],
        raw_text=row["raw_text"], turns=[TurnHit.of(t) for t in turns],
    )
