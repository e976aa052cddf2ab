"""Segmenter state and closed segments in PostgreSQL, advanced in the same
transaction that stores the turns, so state and turns can never disagree.

Closed segments wait in ``memory.segments`` with ``published_at IS NULL``
(an outbox) until they are sent to the `memory.segments` topic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from epistream.contracts.segments import Segment, SegmentTurn
from epistream.contracts.turns import Turn
from epistream.models.prompts import estimate_tokens
from epistream.settings.processes import Settings

from ..segmenter import ClosedSegment, OpenTurn, SegmenterConfig, SegmenterState, Step, close, feed
from .turns import local_time

LOCK_STATE = """
INSERT INTO memory.segmenter_state (tenant, conversation_id) VALUES (%s, %s)
ON CONFLICT (tenant, conversation_id) DO NOTHING
"""
SELECT_STATE = """
SELECT next_seq, open_turn_ids, open_tokens, carried, last_ts, last_session_id
FROM memory.segmenter_state WHERE tenant = %s AND conversation_id = %s FOR UPDATE
"""
SAVE_STATE = """
UPDATE memory.segmenter_state
SET next_seq = %s, open_turn_ids = %s, open_tokens = %s, carried = %s, last_ts = %s,
    last_session_id = %s, updated_at = now()
WHERE tenant = %s AND conversation_id = %s
"""
SEGMENT_TURNS = """
SELECT turn_id, speaker, text, ts, produced_at, tz_offset_s FROM memory.turns
WHERE tenant = %s AND conversation_id = %s AND turn_id = ANY(%s)
"""
INSERT_SEGMENT = """
INSERT INTO memory.segments (tenant, conversation_id, segment_id, seq, turn_ids, overlap_turns, start_ts, end_ts,
                             raw_text, token_estimate, close_reason, produced_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (tenant, segment_id) DO NOTHING
"""
# Cross-tenant housekeeping goes through two narrow SECURITY DEFINER functions
# (sql/007): row-level security hides every other tenant's rows from the workers.
IDLE_CONVERSATIONS = "SELECT tenant, conversation_id, last_turn_id FROM memory.idle_conversations(%s::interval, %s)"
UNPUBLISHED = "SELECT tenant, segment_id FROM memory.unpublished_segments(%s::interval, %s)"
SEGMENT_BY_ID = """
SELECT tenant, conversation_id, segment_id, seq, close_reason, overlap_turns, token_estimate, turn_ids, produced_at
FROM memory.segments WHERE tenant = %s AND segment_id = %s
"""
CLOSED_CONTAINING = """
SELECT segment_id, turn_ids FROM memory.segments
WHERE tenant = %s AND conversation_id = %s AND turn_ids && %s::text[]
ORDER BY seq
"""
# A rebuilt segment's enrichment is stale: it goes back to pending and into the outbox (unpublished),
# so it is sent and enriched again. Only when its text really changed.
REBUILD_SEGMENT = """
UPDATE memory.segments
SET raw_text = %s, start_ts = %s, end_ts = %s, token_estimate = %s,
    status = 'pending', error = NULL, enriched_at = NULL, published_at = NULL, closed_at = now()
WHERE tenant = %s AND segment_id = %s AND raw_text IS DISTINCT FROM %s
RETURNING segment_id
"""
MARK_PUBLISHED = "UPDATE memory.segments SET published_at = now() WHERE tenant = %s AND segment_id = ANY(%s)"


def segment_id(conversation_id: str, seq: int) -> str:
    return f"{conversation_id}#{seq:04d}"


def config_from(settings: Settings) -> SegmenterConfig:
    return SegmenterConfig(
        max_tokens=settings.segment_max_tokens,
        overlap_share=settings.segment_overlap,
        max_gap=timedelta(seconds=settings.segment_max_gap_s),
    )


def turn_line(speaker: str, text: str, ts: datetime) -> str:
    """How a turn reads inside a segment: its time and speaker travel with it."""
    return f"[{ts:%Y-%m-%d %H:%M %z}] {speaker}: {text}"


@dataclass(frozen=True)
class _Key:
    tenant: str
    conversation_id: str


async def _load(conn: AsyncConnection, key: _Key) -> SegmenterState:
    await conn.execute(LOCK_STATE, (key.tenant, key.conversation_id))
    cur = await conn.execute(SELECT_STATE, (key.tenant, key.conversation_id))
    row = await cur.fetchone()
    assert row is not None
    next_seq, turn_ids, tokens, carried, last_ts, last_session = row
    return SegmenterState(
        next_seq=next_seq,
        open=tuple(OpenTurn(t, n) for t, n in zip(turn_ids, tokens, strict=True)),
        carried=carried,
        last_ts=last_ts,
        last_session_id=last_session,
    )


async def _save(conn: AsyncConnection, key: _Key, state: SegmenterState) -> None:
    await conn.execute(
        SAVE_STATE,
        (
            state.next_seq, [t.turn_id for t in state.open], [t.tokens for t in state.open], state.carried,
            state.last_ts, state.last_session_id, key.tenant, key.conversation_id,
        ),
    )


async def _segment_rows(conn: AsyncConnection, key: _Key, turn_ids: Sequence[str]) -> list[tuple]:
    """The segment's stored turns in its order, as (turn_id, speaker, text, local ts, produced_at)."""
    cur = await conn.execute(SEGMENT_TURNS, (key.tenant, key.conversation_id, list(turn_ids)))
    rows = {r[0]: (*r[:3], local_time(r[3], r[5]), r[4]) for r in await cur.fetchall()}
    return [rows[t] for t in turn_ids if t in rows]


def _text(ordered: Sequence[tuple]) -> str:
    return "\n".join(turn_line(r[1], r[2], r[3]) for r in ordered)


async def _store_closed(conn: AsyncConnection, key: _Key, closed: Sequence[ClosedSegment]) -> list[str]:
    ids = []
    for segment in closed:
        ordered = await _segment_rows(conn, key, segment.turn_ids)
        if not ordered:
            continue
        produced = [r[4] for r in ordered if r[4] is not None]
        sid = segment_id(key.conversation_id, segment.seq)
        await conn.execute(
            INSERT_SEGMENT,
            (
                key.tenant, key.conversation_id, sid, segment.seq, [r[0] for r in ordered], segment.overlap_turns,
                min(r[3] for r in ordered), max(r[3] for r in ordered),
                _text(ordered), segment.token_estimate, segment.reason,
                max(produced) if produced else None,
            ),
        )
        ids.append(sid)
    return ids


async def advance(conn: AsyncConnection, new_turns: Sequence[Turn], config: SegmenterConfig) -> list[tuple[str, str]]:
    """Feed newly inserted turns (in arrival order) to their conversations' segmenters.

    Returns (tenant, segment_id) of every segment this closed. Call inside the
    transaction that inserted the turns."""
    by_conversation: dict[_Key, list[Turn]] = {}
    for turn in new_turns:
        by_conversation.setdefault(_Key(turn.tenant, turn.conversation_id), []).append(turn)
    closed_ids: list[tuple[str, str]] = []
    # A fixed lock order keeps two workers from deadlocking on the same conversations.
    for key in sorted(by_conversation, key=lambda k: (k.tenant, k.conversation_id)):
        state = await _load(conn, key)
        closed: list[ClosedSegment] = []
        for turn in by_conversation[key]:
            step = feed(
                state, turn_id=turn.turn_id, tokens=estimate_tokens(turn_line(turn.speaker, turn.text, turn.ts)),
                ts=turn.ts, session_id=turn.session_id, config=config,
            )
            state = step.state
            closed.extend(step.closed)
        await _save(conn, key, state)
        closed_ids.extend((key.tenant, sid) for sid in await _store_closed(conn, key, closed))
    return closed_ids


async def rebuild_containing(conn: AsyncConnection, corrected: Sequence[Turn]) -> list[tuple[str, str]]:
    """Rebuild every closed segment that holds a corrected turn (same id, new content): its text, times
    and token estimate from the turns as stored now; its enrichment is marked stale (pending, unpublished).
    The segment's cut (which turns) stays: it was decided in partition order. Returns (tenant, segment_id)
    of the segments whose text changed. Call inside the transaction that updated the turns."""
    by_conversation: dict[_Key, set[str]] = {}
    for turn in corrected:
        by_conversation.setdefault(_Key(turn.tenant, turn.conversation_id), set()).add(turn.turn_id)
    rebuilt: list[tuple[str, str]] = []
    for key in sorted(by_conversation, key=lambda k: (k.tenant, k.conversation_id)):
        cur = await conn.execute(CLOSED_CONTAINING, (key.tenant, key.conversation_id, sorted(by_conversation[key])))
        for sid, turn_ids in await cur.fetchall():
            ordered = await _segment_rows(conn, key, turn_ids)
            if not ordered:
                continue
            text = _text(ordered)
            tokens = sum(estimate_tokens(turn_line(r[1], r[2], r[3])) for r in ordered)
            cur = await conn.execute(REBUILD_SEGMENT, (
                text, min(r[3] for r in ordered), max(r[3] for r in ordered), tokens, key.tenant, sid, text))
            if await cur.fetchone() is not None:
                rebuilt.append((key.tenant, sid))
    return rebuilt


async def close_if_idle(
    conn: AsyncConnection, tenant: str, conversation_id: str, after_turn_id: str, config: SegmenterConfig
) -> list[tuple[str, str]]:
    """Apply a close request: only if the open segment still ends at `after_turn_id`
    (a turn that arrived since makes the request stale, and duplicates are no-ops)."""
    key = _Key(tenant, conversation_id)
    state = await _load(conn, key)
    if not state.open or state.open[-1].turn_id != after_turn_id:
        return []
    step: Step = close(state, "idle", config)
    await _save(conn, key, step.state)
    return [(tenant, sid) for sid in await _store_closed(conn, key, step.closed)]


async def idle_conversations(conn: AsyncConnection, idle_s: float, limit: int = 100) -> list[tuple[str, str, str]]:
    cur = await conn.execute(IDLE_CONVERSATIONS, (timedelta(seconds=idle_s), limit))
    return [tuple(r) for r in await cur.fetchall()]


async def load_segment(conn: AsyncConnection, tenant: str, sid: str) -> Segment | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(SEGMENT_BY_ID, (tenant, sid))
    row = await cur.fetchone()
    if row is None:
        return None
    turns_cur = await conn.execute(SEGMENT_TURNS, (tenant, row["conversation_id"], row["turn_ids"]))
    by_id = {r[0]: r for r in await turns_cur.fetchall()}
    turns = [
        SegmentTurn(turn_id=t, speaker=by_id[t][1], text=by_id[t][2], ts=local_time(by_id[t][3], by_id[t][5]))
        for t in row["turn_ids"] if t in by_id
    ]
    return Segment(
        tenant=row["tenant"], conversation_id=row["conversation_id"], segment_id=row["segment_id"], seq=row["seq"],
        close_reason=row["close_reason"], overlap_turns=row["overlap_turns"], token_estimate=row["token_estimate"],
        turns=turns, produced_at=row["produced_at"],
    )


async def unpublished(conn: AsyncConnection, older_than_s: float, limit: int = 100) -> list[tuple[str, str]]:
    cur = await conn.execute(UNPUBLISHED, (timedelta(seconds=older_than_s), limit))
    return [tuple(r) for r in await cur.fetchall()]


async def mark_published(conn: AsyncConnection, tenant: str, segment_ids: list[str]) -> None:
    await conn.execute(MARK_PUBLISHED, (tenant, segment_ids))
