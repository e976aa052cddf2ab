"""The router: which segments should an assistant read for this question?

Three pathways score segments, each on its own PostgreSQL index (as in E-mem):
  summary  dense (HNSW) + full-text on the segment summary
  dense    turn embeddings (HNSW), a segment scoring its best turn
  lexical  full-text on the raw turns, a segment summing its turns' ranks;
           a turn matching every keyword of the question force-includes its segment
Fusion is weighted min-max (0.3 / 0.4 / 0.3 by default) or reciprocal rank.
Turns not yet in a closed segment form one "open" segment per conversation,
so the newest memory is routable before enrichment catches up.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Literal

import numpy as np
from psycopg import AsyncConnection

from .timefilter import DateRange

PATHWAYS = ("summary", "dense", "lexical")
OPEN_SUFFIX = "#open"

# The question's lexemes OR-ed (plainto_tsquery alone ANDs them: too strict to rank with).
_OR_QUERY = "to_tsquery('english', replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | '))"
_SCOPE = """tenant = %(tenant)s
    AND (%(conversations)s::text[] IS NULL OR conversation_id = ANY(%(conversations)s))"""
_SEGMENT_TIME = "(%(start)s::timestamptz IS NULL OR (end_ts >= %(start)s AND start_ts < %(end)s))"
_TURN_TIME = "(%(start)s::timestamptz IS NULL OR (t.ts >= %(start)s AND t.ts < %(end)s))"

SUMMARY_PATHWAY = f"""
WITH dense AS (
    SELECT segment_id, 1 - (summary_embedding <=> %(vector)s) AS similarity FROM memory.segments
    WHERE {_SCOPE} AND summary_embedding IS NOT NULL AND {_SEGMENT_TIME}
    ORDER BY summary_embedding <=> %(vector)s LIMIT %(candidates)s
), lexical AS (
    SELECT segment_id, ts_rank_cd(summary_tsv, q) AS rank FROM memory.segments, {_OR_QUERY} q
    WHERE {_SCOPE} AND numnode(q) > 0 AND summary_tsv @@ q AND {_SEGMENT_TIME}
    ORDER BY rank DESC LIMIT %(candidates)s
)
SELECT segment_id, coalesce(d.similarity, 0)::float8, coalesce(l.rank, 0)::float8
FROM dense d FULL JOIN lexical l USING (segment_id)
"""  # noqa: S608 (constant fragments only; values are bound)

# A turn belongs to every segment listing it (overlaps); unsegmented turns to the open one.
_TURN_SEGMENTS = f"""
SELECT coalesce(s.segment_id, h.conversation_id || '{OPEN_SUFFIX}') AS segment_id,
       h.conversation_id, h.turn_id, h.score
FROM hits h
LEFT JOIN memory.segments s
       ON s.tenant = h.tenant AND s.conversation_id = h.conversation_id AND s.turn_ids @> ARRAY[h.turn_id]
"""  # noqa: S608

DENSE_PATHWAY = f"""
WITH hits AS (
    SELECT t.tenant, t.conversation_id, t.turn_id, 1 - (t.embedding <=> %(vector)s) AS score
    FROM memory.turns t WHERE t.{_SCOPE} AND {_TURN_TIME}
    ORDER BY t.embedding <=> %(vector)s LIMIT %(turn_candidates)s
)
{_TURN_SEGMENTS}
"""  # noqa: S608

LEXICAL_PATHWAY = f"""
WITH q AS (SELECT {_OR_QUERY} AS any_term, plainto_tsquery('english', %(query)s) AS all_terms),
hits AS (
    SELECT t.tenant, t.conversation_id, t.turn_id,
           ts_rank_cd(t.tsv, q.any_term) AS score,
           (numnode(q.all_terms) >= 3 AND t.tsv @@ q.all_terms) AS strong
    FROM memory.turns t, q
    WHERE t.{_SCOPE} AND numnode(q.any_term) > 0 AND t.tsv @@ q.any_term AND {_TURN_TIME}
    ORDER BY score DESC LIMIT %(turn_candidates)s
)
SELECT r.segment_id, r.conversation_id, r.turn_id, r.score, h.strong
FROM ({_TURN_SEGMENTS}) r JOIN hits h USING (conversation_id, turn_id)
"""  # noqa: S608

SEGMENT_TURN_IDS = f"""
SELECT segment_id, conversation_id, turn_ids FROM memory.segments
WHERE {_SCOPE} AND segment_id = ANY(%(segment_ids)s)
"""  # noqa: S608
OPEN_TURN_IDS = f"""
SELECT t.conversation_id, array_agg(t.turn_id ORDER BY t.ts) FROM memory.turns t
WHERE t.{_SCOPE} AND t.conversation_id = ANY(%(open_conversations)s)
  AND NOT EXISTS (SELECT 1 FROM memory.segments s WHERE s.tenant = t.tenant
                  AND s.conversation_id = t.conversation_id AND s.turn_ids @> ARRAY[t.turn_id])
GROUP BY t.conversation_id
"""  # noqa: S608


@dataclass(frozen=True)
class RouterConfig:
    top_k: int = 5
    candidates: int = 50
    fusion: Literal["minmax", "rrf"] = "minmax"
    weights: tuple[float, float, float] = (0.3, 0.4, 0.3)
    pathways: tuple[str, ...] = PATHWAYS
    force_include: bool = True
    rrf_k: int = 60

    def only(self, pathway: str) -> RouterConfig:
        """The same router with a single pathway (ablations, per-pathway recall)."""
        return replace(self, pathways=(pathway,), force_include=self.force_include and pathway == "lexical")


@dataclass(frozen=True)
class RoutedSegment:
    segment_id: str
    conversation_id: str
    turn_ids: tuple[str, ...]
    score: float
    pathway_scores: dict[str, float] = field(default_factory=dict)
    forced: bool = False

    @property
    def is_open(self) -> bool:
        return self.segment_id.endswith(OPEN_SUFFIX)


@dataclass
class _Candidates:
    scores: dict[str, dict[str, float]] = field(default_factory=lambda: {p: {} for p in PATHWAYS})
    conversation: dict[str, str] = field(default_factory=dict)
    forced: set[str] = field(default_factory=set)


def _time_params(window: DateRange | None) -> dict[str, datetime | date | None]:
    if window is None:
        return {"start": None, "end": None}
    return {"start": window.start, "end": window.end}


async def _summary(conn: AsyncConnection, params: dict, found: _Candidates) -> None:
    cur = await conn.execute(SUMMARY_PATHWAY, params)
    rows = await cur.fetchall()
    top_rank = max((r[2] for r in rows), default=0.0) or 1.0
    for segment_id, similarity, rank in rows:
        # Dense and lexical alignment with the summary count equally within this pathway.
        found.scores["summary"][segment_id] = 0.5 * similarity + 0.5 * (rank / top_rank)
        found.conversation.setdefault(segment_id, segment_id.rsplit("#", 1)[0])


async def _dense(conn: AsyncConnection, params: dict, found: _Candidates) -> None:
    cur = await conn.execute(DENSE_PATHWAY, params)
    for segment_id, conversation_id, _, score in await cur.fetchall():
        found.scores["dense"][segment_id] = max(found.scores["dense"].get(segment_id, 0.0), score)
        found.conversation[segment_id] = conversation_id


async def _lexical(conn: AsyncConnection, params: dict, found: _Candidates, force: bool) -> None:
    cur = await conn.execute(LEXICAL_PATHWAY, params)
    for segment_id, conversation_id, _, score, strong in await cur.fetchall():
        found.scores["lexical"][segment_id] = found.scores["lexical"].get(segment_id, 0.0) + score
        found.conversation[segment_id] = conversation_id
        if force and strong:
            found.forced.add(segment_id)


def fuse(scores: dict[str, dict[str, float]], config: RouterConfig) -> dict[str, float]:
    """Combine pathway scores: weighted min-max, or reciprocal rank."""
    fused: dict[str, float] = {}
    weights = dict(zip(PATHWAYS, config.weights, strict=True))
    for pathway in config.pathways:
        pathway_scores = scores.get(pathway, {})
        if not pathway_scores:
            continue
        if config.fusion == "rrf":
            ranked = sorted(pathway_scores, key=lambda s: (-pathway_scores[s], s))
            for rank, segment_id in enumerate(ranked, start=1):
                fused[segment_id] = fused.get(segment_id, 0.0) + 1.0 / (config.rrf_k + rank)
            continue
        low, high = min(pathway_scores.values()), max(pathway_scores.values())
        for segment_id, value in pathway_scores.items():
            normalised = 1.0 if high == low else (value - low) / (high - low)
            fused[segment_id] = fused.get(segment_id, 0.0) + weights[pathway] * normalised
    return fused


def select(fused: dict[str, float], forced: set[str], top_k: int) -> list[str]:
    """The top-k by fused score, plus any force-included segment beyond them."""
    ranked = sorted(fused, key=lambda s: (-fused[s], s))
    chosen = ranked[:top_k]
    chosen += [s for s in ranked[top_k:] if s in forced][:top_k]
    return chosen


async def route(
    conn: AsyncConnection,
    *,
    tenant: str,
    question: str,
    vector: np.ndarray,
    conversation_ids: list[str] | None,
    config: RouterConfig,
    window: DateRange | None = None,
) -> list[RoutedSegment]:
    """Activated segments, best first. Run inside `tenant_scope(conn, tenant)`."""
    params = {
        "tenant": tenant, "conversations": conversation_ids or None, "query": question, "vector": vector,
        "candidates": config.candidates, "turn_candidates": config.candidates * 4, **_time_params(window),
    }
    found = _Candidates()
    if "summary" in config.pathways:
        await _summary(conn, params, found)
    if "dense" in config.pathways:
        await _dense(conn, params, found)
    if "lexical" in config.pathways:
        await _lexical(conn, params, found, config.force_include)
    fused = fuse(found.scores, config)
    chosen = select(fused, found.forced, config.top_k)
    turn_ids = await _turn_ids(conn, params, chosen, found)
    return [
        RoutedSegment(
            segment_id=s, conversation_id=found.conversation.get(s, s.rsplit("#", 1)[0]),
            turn_ids=turn_ids.get(s, ()), score=round(fused[s], 6),
            pathway_scores={p: round(found.scores[p][s], 6) for p in PATHWAYS if s in found.scores[p]},
            forced=s in found.forced,
        )
        for s in chosen
    ]


async def _turn_ids(conn: AsyncConnection, params: dict, chosen: list[str], found: _Candidates) -> dict[str, tuple]:
    closed = [s for s in chosen if not s.endswith(OPEN_SUFFIX)]
    open_conversations = [found.conversation[s] for s in chosen if s.endswith(OPEN_SUFFIX)]
    result: dict[str, tuple] = {}
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
