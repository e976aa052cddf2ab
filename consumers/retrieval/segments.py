"""The router's three pathways, each scoring segments on its own PostgreSQL index (as in E-mem):

  summary  dense (HNSW) + full-text on the segment summary
  dense    turn embeddings (HNSW), a segment scoring its best turn
  lexical  full-text on the raw turns, a segment summing its turns' ranks; a turn
           matching every keyword (three or more) of the question is "strong"

Turns not yet in a closed segment form one "open" segment per conversation
(``<conversation_id>#open``), so the newest memory is routable before enrichment
catches up. Then the turn ids of the chosen segments, closed or open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from functools import cache
from typing import Any

import numpy as np
from psycopg import AsyncConnection, sql

from epistream.core import tracing

from ..timefilter import DateRange
from .fragments import (
    ALL_KEYWORDS,
    TURN_IN_WINDOW,
    TextSearchConfig,
    any_keyword,
    conversations,
    in_scope,
    matches,
    nearest,
    overlaps_window,
)
from .fusion import Scores
from .recipes import KEYWORD_CONFIG, SEGMENT_PATHWAYS, SegmentRecipe

OPEN_SUFFIX = "#open"

_SEGMENT_IN_WINDOW = overlaps_window(sql.SQL("s.start_ts"), sql.SQL("s.end_ts"), "instant")


@cache
def summary_pathway(keyword_config: TextSearchConfig) -> sql.Composed:
    return sql.SQL("""
WITH dense AS (
    SELECT segment_id, 1 - distance AS similarity
    FROM ({nearest}) n
), lexical AS (
    SELECT s.segment_id, ts_rank_cd(s.summary_tsv, q) AS rank FROM memory.segments s, {any_keyword} q
    WHERE {scope} AND {matches} AND {in_window}
    ORDER BY rank DESC LIMIT %(candidates)s
)
SELECT segment_id, coalesce(d.similarity, 0)::float8, coalesce(l.rank, 0)::float8
FROM dense d FULL JOIN lexical l USING (segment_id)
""").format(
        nearest=nearest("segments", "s", sql.SQL("s.segment_id"),
                        sql.SQL("{scope} AND s.summary_embedding IS NOT NULL AND {in_window}").format(
                            scope=in_scope("s"), in_window=_SEGMENT_IN_WINDOW),
                        limit="candidates", embedding="summary_embedding"),
        any_keyword=any_keyword(keyword_config), scope=in_scope("s"),
        matches=matches(sql.SQL("s.summary_tsv"), sql.SQL("q")), in_window=_SEGMENT_IN_WINDOW)


# A turn belongs to every segment listing it (overlaps); unsegmented turns to the open one.
_TURN_SEGMENTS = sql.SQL("""
SELECT coalesce(s.segment_id, h.conversation_id || {open_suffix}) AS segment_id,
       h.conversation_id, h.turn_id, h.score
FROM hits h
LEFT JOIN memory.segments s
       ON s.tenant = h.tenant AND s.conversation_id = h.conversation_id AND s.turn_ids @> ARRAY[h.turn_id]
""").format(open_suffix=sql.Literal(OPEN_SUFFIX))

DENSE_PATHWAY = sql.SQL("""
WITH hits AS (
    SELECT tenant, conversation_id, turn_id, 1 - distance AS score
    FROM ({nearest}) n
)
{turn_segments}
""").format(nearest=nearest("turns", "t", sql.SQL("t.tenant, t.conversation_id, t.turn_id"),
                            sql.SQL("{scope} AND {in_window}").format(scope=in_scope("t"), in_window=TURN_IN_WINDOW),
                            limit="turn_candidates"),
            turn_segments=_TURN_SEGMENTS)


@cache
def lexical_pathway(keyword_config: TextSearchConfig) -> sql.Composed:
    return sql.SQL("""
WITH q AS (SELECT {any_keyword} AS any_term, {all_keywords} AS all_terms),
hits AS (
    SELECT t.tenant, t.conversation_id, t.turn_id,
           ts_rank_cd(t.tsv, q.any_term) AS score,
           (numnode(q.all_terms) >= 3 AND t.tsv @@ q.all_terms) AS strong
    FROM memory.turns t, q
    WHERE {scope} AND {matches} AND {in_window}
    ORDER BY score DESC LIMIT %(turn_candidates)s
)
SELECT r.segment_id, r.conversation_id, r.turn_id, r.score, h.strong
FROM ({turn_segments}) r JOIN hits h USING (conversation_id, turn_id)
""").format(any_keyword=any_keyword(keyword_config), all_keywords=ALL_KEYWORDS, scope=in_scope("t"),
            matches=matches(sql.SQL("t.tsv"), sql.SQL("q.any_term")), in_window=TURN_IN_WINDOW,
            turn_segments=_TURN_SEGMENTS)


SEGMENT_TURN_IDS = sql.SQL("""
SELECT s.segment_id, s.conversation_id, s.turn_ids FROM memory.segments s
WHERE {scope} AND s.segment_id = ANY(%(segment_ids)s)
""").format(scope=in_scope("s"))
OPEN_TURN_IDS = sql.SQL("""
SELECT t.conversation_id, array_agg(t.turn_id ORDER BY t.ts) FROM memory.turns t
WHERE {scope} AND t.conversation_id = ANY(%(open_conversations)s)
  AND NOT EXISTS (SELECT 1 FROM memory.segments s WHERE s.tenant = t.tenant
                  AND s.conversation_id = t.conversation_id AND s.turn_ids @> ARRAY[t.turn_id])
GROUP BY t.conversation_id
""").format(scope=in_scope("t"))


@dataclass
class Candidates:
    """What the pathways found: scores per pathway, each segment's conversation, the force-included."""

    scores: Scores = field(default_factory=lambda: {p: {} for p in SEGMENT_PATHWAYS})
    conversation: dict[str, str] = field(default_factory=dict)
    forced: set[str] = field(default_factory=set)


def route_params(*, tenant: str, question: str, vector: np.ndarray, conversation_ids: list[str] | None,
                 recipe: SegmentRecipe, window: DateRange | None) -> dict[str, Any]:
    time: dict[str, datetime | date | None] = (
        {"start": None, "end": None} if window is None else {"start": window.start, "end": window.end})
    return {"tenant": tenant, "conversations": conversations(conversation_ids), "query": question,
            "vector": vector, "candidates": recipe.candidates, "turn_candidates": recipe.turn_candidates, **time}


@tracing.traced("route summary", {"epistream.pathways": "summary"})
async def _summary(conn: AsyncConnection, params: dict, recipe: SegmentRecipe, found: Candidates) -> None:
    cur = await conn.execute(summary_pathway(KEYWORD_CONFIG), params)
    rows = await cur.fetchall()
    top_rank = max((r[2] for r in rows), default=0.0) or 1.0
    for segment_id, similarity, rank in rows:
        # Dense and lexical alignment with the summary count equally within this pathway.
        found.scores["summary"][segment_id] = 0.5 * similarity + 0.5 * (rank / top_rank)
        found.conversation.setdefault(segment_id, segment_id.rsplit("#", 1)[0])


@tracing.traced("route dense", {"epistream.pathways": "dense"})
async def _dense(conn: AsyncConnection, params: dict, recipe: SegmentRecipe, found: Candidates) -> None:
    cur = await conn.execute(DENSE_PATHWAY, params)
    for segment_id, conversation_id, _, score in await cur.fetchall():
        found.scores["dense"][segment_id] = max(found.scores["dense"].get(segment_id, 0.0), score)
        found.conversation[segment_id] = conversation_id


@tracing.traced("route lexical", {"epistream.pathways": "lexical"})
async def _lexical(conn: AsyncConnection, params: dict, recipe: SegmentRecipe, found: Candidates) -> None:
    cur = await conn.execute(lexical_pathway(KEYWORD_CONFIG), params)
    for segment_id, conversation_id, _, score, strong in await cur.fetchall():
        found.scores["lexical"][segment_id] = found.scores["lexical"].get(segment_id, 0.0) + score
        found.conversation[segment_id] = conversation_id
        if recipe.force_include and strong:
            found.forced.add(segment_id)


_PATHWAYS = {"summary": _summary, "dense": _dense, "lexical": _lexical}


async def score_segments(conn: AsyncConnection, params: dict[str, Any], recipe: SegmentRecipe) -> Candidates:
    """Run the recipe's pathways (in summary, dense, lexical order) and gather their scores."""
    found = Candidates()
    for pathway in SEGMENT_PATHWAYS:
        if pathway in recipe.pathways:
            await _PATHWAYS[pathway](conn, params, recipe, found)
    return found


async def segment_turn_ids(conn: AsyncConnection, params: dict[str, Any], chosen: list[str],
                           found: Candidates) -> dict[str, tuple[str, ...]]:
    """The turn ids of the chosen segments: a closed one's list, an open one's unsegmented turns by time."""
    closed = [s for s in chosen if not s.endswith(OPEN_SUFFIX)]
    open_conversations = [found.conversation[s] for s in chosen if s.endswith(OPEN_SUFFIX)]
    result: dict[str, tuple[str, ...]] = {}
    if closed:
        cur = await conn.execute(SEGMENT_TURN_IDS, params | {"segment_ids": closed})
        for segment_id, conversation_id, ids in await cur.fetchall():
            result[segment_id] = tuple(ids)
            found.conversation[segment_id] = conversation_id
    if open_conversations:
        cur = await conn.execute(OPEN_TURN_IDS, params | {"open_conversations": open_conversations})
        for conversation_id, ids in await cur.fetchall():
            result[conversation_id + OPEN_SUFFIX] = tuple(ids)
    return result
