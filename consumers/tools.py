"""The retrieval tools of REMem's agentic mode, as plain async functions over a
connection already inside ``tenant_scope``.

- ``semantic_retrieve`` / ``lexical_retrieve``: seed gists or turns, by meaning
  (pgvector HNSW) or by words (Postgres full-text), with time filters.
- ``find_gist_contexts``: a gist's source turns, its neighbours in time, the
  entities it mentions and its near-paraphrases (cosine > 0.8).
- ``find_entity_contexts``: temporal facts by subject / predicate / object and
  time range, ordered, paged and aggregated (count, first, last).
- ``read_segment``: a segment's raw text, summary and turns, for an assistant read.

``call_tool`` is the dispatcher a model loop uses: it validates the model's
arguments as data (pydantic, extra fields forbidden, bounded limits), resolves
date expressions ("last year", "May 2023") against the time the question was
asked, runs the tool and returns a small JSON-serialisable dict.

Every statement below is a constant with bound parameters: no model or user
text is ever formatted into SQL. Each also filters on ``tenant`` explicitly,
on top of row-level security.
"""

from __future__ import annotations

import asyncio
import calendar
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, is_dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Annotated, Any, Literal, Protocol

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.dates import ResolvedDate, resolve
from pipeline.entities import normalize_name, normalize_predicate

Target = Literal["gists", "turns"]
Operator = Literal["or", "and", "phrase"]
Order = Literal["asc", "desc"]
Aggregate = Literal["none", "count", "first", "last"]

MAX_LIMIT = 50
MAX_OFFSET = 1000
MAX_WINDOW = 10
SIMILAR_LIMIT = 5
SIMILAR_MIN_COSINE = 0.8
ENTITY_MATCH_LIMIT = 20
MAX_TEXT_CHARS = 1500  # any one string in a tool result
MAX_RAW_TEXT_CHARS = 12_000  # a segment's raw text
MAX_RESULT_CHARS = 24_000  # a whole tool result, as JSON

# --------------------------------------------------------------------------- SQL
# A gist's date covers its whole period at its precision ("2023-05" is all of May),
# so a time filter keeps a gist whose period overlaps [start, end] (both inclusive).
# A turn's day is the speaker's local day (ts shifted by the stored UTC offset).
# hnsw.iterative_scan = relaxed_order (set by the pool) keeps filtered nearest-
# neighbour scans going until LIMIT rows pass; the materialised CTE then restores
# exact distance order, as pgvector recommends.
SEMANTIC_GISTS = """
WITH nearest AS MATERIALIZED (
    SELECT g.gist_id, g.conversation_id, g.segment_id, g.text, g.event_date, g.date_precision, g.turn_ids,
           g.said_at, g.embedding <=> %(vector)s AS distance
    FROM memory.gists g
    WHERE g.tenant = %(tenant)s
      AND (%(conversations)s::text[] IS NULL OR g.conversation_id = ANY(%(conversations)s))
      AND (%(end)s::date IS NULL OR date_trunc(g.date_precision, g.event_date::timestamp)::date <= %(end)s)
      AND (%(start)s::date IS NULL OR (date_trunc(g.date_precision, g.event_date::timestamp)
                                       + ('1 ' || g.date_precision)::interval)::date > %(start)s)
    ORDER BY g.embedding <=> %(vector)s
    LIMIT %(limit)s
)
SELECT gist_id, conversation_id, segment_id, text, event_date, date_precision, turn_ids, said_at,
       (1 - distance)::float8 AS score
FROM nearest
ORDER BY distance + 0, gist_id
"""

SEMANTIC_TURNS = """
WITH nearest AS MATERIALIZED (
    SELECT t.conversation_id, t.turn_id, t.speaker, t.text, t.ts, t.tz_offset_s, t.session_id,
           t.embedding <=> %(vector)s AS distance
    FROM memory.turns t
    WHERE t.tenant = %(tenant)s
      AND (%(conversations)s::text[] IS NULL OR t.conversation_id = ANY(%(conversations)s))
      AND (%(start)s::date IS NULL
           OR (t.ts AT TIME ZONE 'UTC' + make_interval(secs => t.tz_offset_s))::date >= %(start)s)
      AND (%(end)s::date IS NULL
           OR (t.ts AT TIME ZONE 'UTC' + make_interval(secs => t.tz_offset_s))::date <= %(end)s)
    ORDER BY t.embedding <=> %(vector)s
    LIMIT %(limit)s
)
SELECT n.conversation_id, n.turn_id, n.speaker, n.text, n.ts, n.tz_offset_s, n.session_id,
       (SELECT s.segment_id FROM memory.segments s
        WHERE s.tenant = %(tenant)s AND s.conversation_id = n.conversation_id AND s.turn_ids @> ARRAY[n.turn_id]
        ORDER BY s.seq LIMIT 1) AS segment_id,
       (1 - n.distance)::float8 AS score
FROM nearest n
ORDER BY n.distance + 0, n.conversation_id, n.turn_id
"""

# The three query forms: any word (plainto's lexemes OR-ed: the text of a tsquery
# is valid tsquery input, and 'simple' keeps its lexemes as they are), all words
# (plainto), the words in sequence (phraseto).
LEXICAL_GISTS = """
SELECT g.gist_id, g.conversation_id, g.segment_id, g.text, g.event_date, g.date_precision, g.turn_ids, g.said_at,
       ts_rank_cd(g.tsv, q.query)::float8 AS score
FROM memory.gists g,
     (SELECT CASE %(operator)s
                WHEN 'and' THEN plainto_tsquery('english', %(query)s)
                WHEN 'phrase' THEN phraseto_tsquery('english', %(query)s)
                ELSE to_tsquery('simple', replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | '))
            END AS query) q
WHERE numnode(q.query) > 0 AND g.tsv @@ q.query AND g.tenant = %(tenant)s
  AND (%(conversations)s::text[] IS NULL OR g.conversation_id = ANY(%(conversations)s))
  AND (%(end)s::date IS NULL OR date_trunc(g.date_precision, g.event_date::timestamp)::date <= %(end)s)
  AND (%(start)s::date IS NULL OR (date_trunc(g.date_precision, g.event_date::timestamp)
                                   + ('1 ' || g.date_precision)::interval)::date > %(start)s)
ORDER BY score DESC, g.event_date, g.gist_id
LIMIT %(limit)s
"""

LEXICAL_TURNS = """
SELECT t.conversation_id, t.turn_id, t.speaker, t.text, t.ts, t.tz_offset_s, t.session_id,
       (SELECT s.segment_id FROM memory.segments s
        WHERE s.tenant = %(tenant)s AND s.conversation_id = t.conversation_id AND s.turn_ids @> ARRAY[t.turn_id]
        ORDER BY s.seq LIMIT 1) AS segment_id,
       ts_rank_cd(t.tsv, q.query)::float8 AS score
FROM memory.turns t,
     (SELECT CASE %(operator)s
                WHEN 'and' THEN plainto_tsquery('english', %(query)s)
                WHEN 'phrase' THEN phraseto_tsquery('english', %(query)s)
                ELSE to_tsquery('simple', replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | '))
            END AS query) q
WHERE numnode(q.query) > 0 AND t.tsv @@ q.query AND t.tenant = %(tenant)s
  AND (%(conversations)s::text[] IS NULL OR t.conversation_id = ANY(%(conversations)s))
  AND (%(start)s::date IS NULL
       OR (t.ts AT TIME ZONE 'UTC' + make_interval(secs => t.tz_offset_s))::date >= %(start)s)
  AND (%(end)s::date IS NULL
       OR (t.ts AT TIME ZONE 'UTC' + make_interval(secs => t.tz_offset_s))::date <= %(end)s)
ORDER BY score DESC, t.ts, t.conversation_id, t.turn_id
LIMIT %(limit)s
"""

GIST_BY_ID = """
SELECT g.gist_id, g.conversation_id, g.segment_id, g.text, g.event_date, g.date_precision, g.turn_ids, g.said_at,
       g.embedding
FROM memory.gists g
WHERE g.tenant = %(tenant)s AND g.gist_id = %(gist_id)s
  AND (%(conversations)s::text[] IS NULL OR g.conversation_id = ANY(%(conversations)s))
"""

GIST_SOURCE_TURNS = """
SELECT t.conversation_id, t.turn_id, t.speaker, t.text, t.ts, t.tz_offset_s, t.session_id
FROM memory.turns t
WHERE t.tenant = %(tenant)s AND t.conversation_id = %(conversation_id)s AND t.turn_id = ANY(%(turn_ids)s)
ORDER BY t.ts, t.turn_id
"""

# Neighbours in time: the conversation's gists ordered by (event_date, said_at, gist_id).
GISTS_BEFORE = """
SELECT g.gist_id, g.conversation_id, g.segment_id, g.text, g.event_date, g.date_precision, g.turn_ids, g.said_at
FROM memory.gists g
WHERE g.tenant = %(tenant)s AND g.conversation_id = %(conversation_id)s
  AND (g.event_date, g.said_at, g.gist_id) < (%(event_date)s::date, %(said_at)s::timestamptz, %(gist_id)s::text)
ORDER BY g.event_date DESC, g.said_at DESC, g.gist_id DESC
LIMIT %(window)s
"""

GISTS_AFTER = """
SELECT g.gist_id, g.conversation_id, g.segment_id, g.text, g.event_date, g.date_precision, g.turn_ids, g.said_at
FROM memory.gists g
WHERE g.tenant = %(tenant)s AND g.conversation_id = %(conversation_id)s
  AND (g.event_date, g.said_at, g.gist_id) > (%(event_date)s::date, %(said_at)s::timestamptz, %(gist_id)s::text)
ORDER BY g.event_date, g.said_at, g.gist_id
LIMIT %(window)s
"""

GIST_ENTITIES = """
SELECT e.entity_id, e.name, e.aliases
FROM memory.gist_mentions m
JOIN memory.entities e ON e.tenant = m.tenant AND e.entity_id = m.entity_id
WHERE m.tenant = %(tenant)s AND m.gist_id = %(gist_id)s
ORDER BY e.name, e.entity_id
"""

# The synonym neighbours of the hybrid graph, on the relational side: the nearest
# gists of the tenant (HNSW), kept when cosine similarity > threshold.
SIMILAR_GISTS = """
WITH nearest AS MATERIALIZED (
    SELECT g.gist_id, g.conversation_id, g.segment_id, g.text, g.event_date, g.date_precision, g.turn_ids,
           g.said_at, g.embedding <=> %(vector)s AS distance
    FROM memory.gists g
    WHERE g.tenant = %(tenant)s AND g.gist_id <> %(gist_id)s
      AND (%(conversations)s::text[] IS NULL OR g.conversation_id = ANY(%(conversations)s))
    ORDER BY g.embedding <=> %(vector)s
    LIMIT %(limit)s
)
SELECT gist_id, conversation_id, segment_id, text, event_date, date_precision, turn_ids, said_at,
       (1 - distance)::float8 AS score
FROM nearest
WHERE distance < %(max_distance)s
ORDER BY distance + 0, gist_id
"""

# Candidate entities for a name, best tier first: 1 the normalised name,
# 2 an alias (surface forms, compared case-insensitively), 3 a normalised name
# containing the text. The caller keeps only the best tier found.
MATCH_ENTITIES = """
SELECT m.entity_id, m.name, m.tier
FROM (
    SELECT e.entity_id, e.name, e.normalized_name,
           CASE WHEN e.normalized_name = %(normalized)s THEN 1
                WHEN EXISTS (SELECT 1 FROM unnest(e.aliases) a WHERE lower(btrim(a)) IN (%(lowered)s, %(normalized)s))
                    THEN 2
                ELSE 3 END AS tier
    FROM memory.entities e
    WHERE e.tenant = %(tenant)s
      AND (e.normalized_name = %(normalized)s
           OR EXISTS (SELECT 1 FROM unnest(e.aliases) a WHERE lower(btrim(a)) IN (%(lowered)s, %(normalized)s))
           OR e.normalized_name ILIKE %(pattern)s ESCAPE '\\')
) m
ORDER BY m.tier, length(m.normalized_name), m.name, m.entity_id
LIMIT %(limit)s
"""

# Predicates containing the text, best tier first: 1 equal, 2 prefix, 3 contains.
MATCH_PREDICATES = """
SELECT p.predicate, p.tier
FROM (
    SELECT DISTINCT f.predicate,
           CASE WHEN f.predicate = %(predicate)s THEN 1
                WHEN starts_with(f.predicate, %(predicate)s) THEN 2
                ELSE 3 END AS tier
    FROM memory.facts f
    WHERE f.tenant = %(tenant)s AND strpos(f.predicate, %(predicate)s) > 0
      AND (%(conversations)s::text[] IS NULL OR f.conversation_id = ANY(%(conversations)s))
) p
ORDER BY p.tier, p.predicate
"""

# The facts matching the filters, one per statement: the same triple with the
# same qualifiers said at the same instant (a turn carried into two overlapping
# segments yields it twice) counts once.
# A fact's interval: [point_in_time] for an event; [start_time, end_time] for a
# period, open-ended where a bound is missing; [said_at's day] when undated.
# It matches [start, end] when the two overlap. Its time for ordering is
# coalesce(point_in_time, start_time, said_at::date), then said_at, then fact_id.
# One round trip: the count of matching facts, with the requested page (a row of
# NULLs beside the count when the page is empty).
FACTS = """
WITH source AS (
    SELECT f.* FROM memory.facts f WHERE f.tenant = %(tenant)s AND NOT %(current_only)s
    UNION ALL
    SELECT c.* FROM memory.current_facts c WHERE c.tenant = %(tenant)s AND %(current_only)s
), matching AS (
    SELECT DISTINCT ON (s.conversation_id, s.subject_id, s.predicate, s.object_id,
                        s.point_in_time, s.start_time, s.end_time, s.said_at)
           s.*, coalesce(s.point_in_time, s.start_time, s.said_at::date) AS fact_time
    FROM source s
    WHERE (%(conversations)s::text[] IS NULL OR s.conversation_id = ANY(%(conversations)s))
      AND (%(subject_ids)s::text[] IS NULL OR s.subject_id = ANY(%(subject_ids)s))
      AND (%(object_ids)s::text[] IS NULL OR s.object_id = ANY(%(object_ids)s))
      AND (%(predicates)s::text[] IS NULL OR s.predicate = ANY(%(predicates)s))
      AND (%(end)s::date IS NULL OR CASE WHEN s.point_in_time IS NOT NULL THEN s.point_in_time
                                          WHEN s.start_time IS NOT NULL THEN s.start_time
                                          WHEN s.end_time IS NOT NULL THEN '-infinity'::date
                                          ELSE s.said_at::date END <= %(end)s)
      AND (%(start)s::date IS NULL OR CASE WHEN s.point_in_time IS NOT NULL THEN s.point_in_time
                                            WHEN s.end_time IS NOT NULL THEN s.end_time
                                            WHEN s.start_time IS NOT NULL THEN 'infinity'::date
                                            ELSE s.said_at::date END >= %(start)s)
    ORDER BY s.conversation_id, s.subject_id, s.predicate, s.object_id,
             s.point_in_time, s.start_time, s.end_time, s.said_at, s.fact_id
), counted AS (
    SELECT count(*) AS total FROM matching
)
SELECT c.total, p.*
FROM counted c
LEFT JOIN LATERAL (
    SELECT m.fact_id, m.conversation_id, m.segment_id, sub.name AS subject, m.predicate, obj.name AS object,
           m.point_in_time, m.start_time, m.end_time, m.said_at, m.turn_ids
    FROM matching m
    JOIN memory.entities sub ON sub.tenant = m.tenant AND sub.entity_id = m.subject_id
    JOIN memory.entities obj ON obj.tenant = m.tenant AND obj.entity_id = m.object_id
    ORDER BY CASE WHEN %(ascending)s THEN m.fact_time END ASC,
             CASE WHEN %(ascending)s THEN m.said_at END ASC,
             CASE WHEN %(ascending)s THEN m.fact_id END ASC,
             m.fact_time DESC, m.said_at DESC, m.fact_id DESC
    LIMIT %(limit)s OFFSET %(offset)s
) p ON true
"""

READ_SEGMENT = """
SELECT s.segment_id, s.conversation_id, s.seq, s.start_ts, s.end_ts, s.summary, s.raw_text, s.status, s.turn_ids
FROM memory.segments s
WHERE s.tenant = %(tenant)s AND s.segment_id = %(segment_id)s
  AND (%(conversations)s::text[] IS NULL OR s.conversation_id = ANY(%(conversations)s))
"""

SEGMENT_TURNS = """
SELECT t.conversation_id, t.turn_id, t.speaker, t.text, t.ts, t.tz_offset_s, t.session_id
FROM unnest(%(turn_ids)s::text[]) WITH ORDINALITY AS ids(turn_id, position)
JOIN memory.turns t ON t.tenant = %(tenant)s AND t.conversation_id = %(conversation_id)s AND t.turn_id = ids.turn_id
ORDER BY ids.position
"""


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class GistHit:
    gist_id: str
    conversation_id: str
    segment_id: str
    text: str
    event_date: date
    date_precision: str
    turn_ids: list[str]
    said_at: datetime
    score: float | None = None  # cosine similarity (semantic) or ts_rank_cd (lexical)


@dataclass(frozen=True)
class TurnHit:
    conversation_id: str
    turn_id: str
    speaker: str
    text: str
    ts: datetime  # with the speaker's UTC offset
    session_id: str | None
    segment_id: str | None = None  # the first segment holding the turn, for read_segment
    score: float | None = None


@dataclass(frozen=True)
class EntityRef:
    entity_id: str
    name: str
    aliases: list[str]


@dataclass(frozen=True)
class GistContexts:
    gist: GistHit
    source_turns: list[TurnHit]
    before: list[GistHit]  # up to `window` earlier gists of the conversation, oldest first
    after: list[GistHit]  # up to `window` later gists, oldest first
    entities: list[EntityRef]
    similar: list[GistHit]  # cosine > 0.8, most similar first; score = cosine


@dataclass(frozen=True)
class FactRow:
    fact_id: str
    conversation_id: str
    segment_id: str
    subject: str
    predicate: str
    object: str
    point_in_time: date | None
    start_time: date | None
    end_time: date | None
    said_at: datetime
    turn_ids: list[str]


@dataclass(frozen=True)
class EntityContexts:
    facts: list[FactRow]  # the page (limit/offset); one fact for first/last
    total: int  # facts matching the filters, before limit/offset
    aggregate: str
    count: int | None  # aggregate "count": equals total
    subjects: list[str]  # entity names the subject text matched
    objects: list[str]
    predicates: list[str]  # predicates the predicate text matched


@dataclass(frozen=True)
class SegmentRead:
    segment_id: str
    conversation_id: str
    seq: int
    start_ts: datetime
    end_ts: datetime
    status: str
    summary: str | None
    raw_text: str
    turns: list[TurnHit]


# --------------------------------------------------------------------------- helpers
def _conversations(conversation_ids: list[str] | None) -> list[str] | None:
    return list(conversation_ids) if conversation_ids else None


def _gist(row: dict[str, Any]) -> GistHit:
    return GistHit(
        gist_id=row["gist_id"], conversation_id=row["conversation_id"], segment_id=row["segment_id"],
        text=row["text"], event_date=row["event_date"], date_precision=row["date_precision"],
        turn_ids=list(row["turn_ids"]), said_at=row["said_at"], score=row.get("score"),
    )


def _turn(row: dict[str, Any]) -> TurnHit:
    offset = timezone(timedelta(seconds=row.get("tz_offset_s") or 0))
    return TurnHit(
        conversation_id=row["conversation_id"], turn_id=row["turn_id"], speaker=row["speaker"], text=row["text"],
        ts=row["ts"].astimezone(offset), session_id=row["session_id"], segment_id=row.get("segment_id"),
        score=row.get("score"),
    )


async def _rows(conn: AsyncConnection, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement, params)
        return await cur.fetchall()


def _check_target(target: str) -> None:
    if target not in ("gists", "turns"):
        raise ValueError(f"target must be 'gists' or 'turns', not {target!r}")


def _like_contains(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# --------------------------------------------------------------------------- tools
async def semantic_retrieve(
    conn: AsyncConnection,
    *,
    tenant: str,
    vector: np.ndarray,
    conversation_ids: list[str] | None = None,
    target: Target = "gists",
    start: date | None = None,
    end: date | None = None,
    limit: int = 10,
) -> list[GistHit] | list[TurnHit]:
    """Nearest gists (time = the gist's dated period) or turns (time = the local day), by cosine."""
    _check_target(target)
    params = {"tenant": tenant, "vector": vector, "conversations": _conversations(conversation_ids),
              "start": start, "end": end, "limit": limit}
    if target == "gists":
        return [_gist(r) for r in await _rows(conn, SEMANTIC_GISTS, params)]
    return [_turn(r) for r in await _rows(conn, SEMANTIC_TURNS, params)]


async def lexical_retrieve(
    conn: AsyncConnection,
    *,
    tenant: str,
    query: str,
    conversation_ids: list[str] | None = None,
    target: Target = "gists",
    start: date | None = None,
    end: date | None = None,
    limit: int = 10,
    operator: Operator = "or",
) -> list[GistHit] | list[TurnHit]:
    """Full-text search ranked by ts_rank_cd: any word (or), all words (and), or the phrase."""
    _check_target(target)
    if operator not in ("or", "and", "phrase"):
        raise ValueError(f"operator must be 'or', 'and' or 'phrase', not {operator!r}")
    params = {"tenant": tenant, "query": query, "operator": operator, "conversations": _conversations(conversation_ids),
              "start": start, "end": end, "limit": limit}
    if target == "gists":
        return [_gist(r) for r in await _rows(conn, LEXICAL_GISTS, params)]
    return [_turn(r) for r in await _rows(conn, LEXICAL_TURNS, params)]


async def find_gist_contexts(
    conn: AsyncConnection,
    *,
    tenant: str,
    gist_id: str,
    window: int = 2,
    conversation_ids: list[str] | None = None,
) -> GistContexts | None:
    """The gist with its source turns, time neighbours, mentioned entities and similar gists; None if unknown.

    With ``conversation_ids``, the gist and its similar gists must lie in those conversations.
    """
    conversations = _conversations(conversation_ids)
    found = await _rows(conn, GIST_BY_ID, {"tenant": tenant, "gist_id": gist_id, "conversations": conversations})
    if not found:
        return None
    row = found[0]
    gist = _gist(row)
    around = {"tenant": tenant, "conversation_id": gist.conversation_id, "event_date": gist.event_date,
              "said_at": gist.said_at, "gist_id": gist.gist_id, "window": window}
    turns = await _rows(conn, GIST_SOURCE_TURNS, {"tenant": tenant, "conversation_id": gist.conversation_id,
                                                  "turn_ids": gist.turn_ids})
    before = await _rows(conn, GISTS_BEFORE, around) if window > 0 else []
    after = await _rows(conn, GISTS_AFTER, around) if window > 0 else []
    entities = await _rows(conn, GIST_ENTITIES, {"tenant": tenant, "gist_id": gist.gist_id})
    similar = await _rows(conn, SIMILAR_GISTS, {
        "tenant": tenant, "gist_id": gist.gist_id, "vector": row["embedding"], "conversations": conversations,
        "limit": SIMILAR_LIMIT, "max_distance": 1 - SIMILAR_MIN_COSINE,
    })
    return GistContexts(
        gist=gist,
        source_turns=[_turn(r) for r in turns],
        before=[_gist(r) for r in reversed(before)],
        after=[_gist(r) for r in after],
        entities=[EntityRef(entity_id=r["entity_id"], name=r["name"], aliases=list(r["aliases"])) for r in entities],
        similar=[_gist(r) for r in similar],
    )


async def _match_entities(conn: AsyncConnection, tenant: str, text: str) -> list[dict[str, Any]]:
    normalized = normalize_name(text)
    if not normalized:
        return []
    rows = await _rows(conn, MATCH_ENTITIES, {
        "tenant": tenant, "normalized": normalized, "lowered": " ".join(text.lower().split()),
        "pattern": _like_contains(normalized), "limit": ENTITY_MATCH_LIMIT,
    })
    best = min((r["tier"] for r in rows), default=None)
    return [r for r in rows if r["tier"] == best]


async def _match_predicates(conn: AsyncConnection, tenant: str, text: str,
                            conversations: list[str] | None) -> list[str]:
    predicate = normalize_predicate(text)
    if not predicate:
        return []
    rows = await _rows(conn, MATCH_PREDICATES, {"tenant": tenant, "predicate": predicate,
                                                "conversations": conversations})
    best = min((r["tier"] for r in rows), default=None)
    return [r["predicate"] for r in rows if r["tier"] == best]


async def find_entity_contexts(
    conn: AsyncConnection,
    *,
    tenant: str,
    subject: str | None = None,
    predicate: str | None = None,
    object: str | None = None,  # the tool's argument name, shadowing the builtin here only
    start: date | None = None,
    end: date | None = None,
    order: Order = "asc",
    limit: int = 10,
    offset: int = 0,
    aggregate: Aggregate = "none",
    current_only: bool = False,
    conversation_ids: list[str] | None = None,
) -> EntityContexts:
    """Temporal facts filtered by entity names, predicate and time range; ordered, paged, aggregated.

    Names match by normalised name, else by alias, else by containment in a normalised
    name (the best tier found wins). Predicates match exactly, else by prefix, else by
    containment ('lives' -> 'lives_in'). ``first``/``last`` return the earliest/latest
    fact (``offset`` still applies: last with offset 1 is the one before the latest);
    ``count`` returns the number of matching facts plus the first page.
    """
    if aggregate not in ("none", "count", "first", "last"):
        raise ValueError(f"aggregate must be none, count, first or last, not {aggregate!r}")
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
    conversations = _conversations(conversation_ids)
    subjects = await _match_entities(conn, tenant, subject) if subject is not None else None
    objects = await _match_entities(conn, tenant, object) if object is not None else None
    predicates = await _match_predicates(conn, tenant, predicate, conversations) if predicate is not None else None

    def names(rows: list[dict[str, Any]] | None) -> list[str]:
        return [r["name"] for r in rows or []]

    if subjects == [] or objects == [] or predicates == []:  # a filter that matches nothing
        return EntityContexts(facts=[], total=0, aggregate=aggregate, count=0 if aggregate == "count" else None,
                              subjects=names(subjects), objects=names(objects), predicates=predicates or [])
    ascending = order == "asc"
    if aggregate in ("first", "last"):
        ascending, limit = aggregate == "first", 1
    params = {
        "tenant": tenant, "current_only": current_only, "conversations": conversations,
        "subject_ids": [r["entity_id"] for r in subjects] if subjects is not None else None,
        "object_ids": [r["entity_id"] for r in objects] if objects is not None else None,
        "predicates": predicates, "start": start, "end": end,
        "ascending": ascending, "limit": limit, "offset": offset,
    }
    rows = await _rows(conn, FACTS, params)
    total = int(rows[0]["total"]) if rows else 0
    facts = [FactRow(**{k: v for k, v in r.items() if k != "total"}) for r in rows if r["fact_id"] is not None]
    return EntityContexts(facts=facts, total=total, aggregate=aggregate,
                          count=total if aggregate == "count" else None,
                          subjects=names(subjects), objects=names(objects), predicates=predicates or [])


async def read_segment(
    conn: AsyncConnection,
    *,
    tenant: str,
    segment_id: str,
    conversation_ids: list[str] | None = None,
) -> SegmentRead | None:
    """A segment's raw text, summary and turns (in segment order); None if unknown or out of scope."""
    found = await _rows(conn, READ_SEGMENT, {"tenant": tenant, "segment_id": segment_id,
                                             "conversations": _conversations(conversation_ids)})
    if not found:
        return None
    row = found[0]
    turns = await _rows(conn, SEGMENT_TURNS, {"tenant": tenant, "conversation_id": row["conversation_id"],
                                              "turn_ids": list(row["turn_ids"])})
    return SegmentRead(
        segment_id=row["segment_id"], conversation_id=row["conversation_id"], seq=row["seq"],
        start_ts=row["start_ts"], end_ts=row["end_ts"], status=row["status"], summary=row["summary"],
        raw_text=row["raw_text"], turns=[_turn(r) for r in turns],
    )


# --------------------------------------------------------------------------- arguments
class ToolArgumentError(ValueError):
    """A model proposed a tool that does not exist, or arguments that do not validate."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"{tool}: {message}")
        self.tool = tool


DateText = Annotated[str, Field(min_length=1, max_length=100)]
_START = ("Inclusive lower bound: a date or expression resolved against the question time "
          "('2023-05-14', 'May 2023', '2023', 'last year'); a month or year starts at its first day.")
_END = "Inclusive upper bound, like start; a month or year ends at its last day ('May 2023' -> 2023-05-31)."
_DURING = "Shorthand for start and end both set to one period ('May 2023', 'last year', '2024-03-18')."


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class _TimeArgs(_Args):
    start: DateText | None = Field(None, description=_START)
    end: DateText | None = Field(None, description=_END)
    during: DateText | None = Field(None, description=_DURING)


class SemanticRetrieveArgs(_TimeArgs):
    query: str = Field(min_length=1, max_length=1000, description="What to look for, in words.")
    target: Target = Field("gists", description="'gists' (dated one-sentence events) or 'turns' (raw dialogue).")
    limit: int = Field(10, ge=1, le=MAX_LIMIT, description="How many results.")


class LexicalRetrieveArgs(SemanticRetrieveArgs):
    operator: Operator = Field(
        "or", description="'or': any of the words; 'and': all of them; 'phrase': the words in sequence.")


class FindGistContextsArgs(_Args):
    gist_id: str = Field(min_length=1, max_length=300, description="A gist_id from a retrieval result.")
    window: int = Field(2, ge=0, le=MAX_WINDOW, description="Neighbouring gists in time on each side.")


class FindEntityContextsArgs(_TimeArgs):
    subject: str | None = Field(None, min_length=1, max_length=200, description="Subject entity name.")
    predicate: str | None = Field(
        None, min_length=1, max_length=100, description="Relation, e.g. 'lives_in', 'visited'; a prefix matches too.")
    object: str | None = Field(None, min_length=1, max_length=200, description="Object entity name.")
    order: Order = Field("asc", description="By the fact's time: 'asc' oldest first, 'desc' newest first.")
    limit: int = Field(10, ge=1, le=MAX_LIMIT, description="Facts per page.")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="Facts to skip (offset 1 with order asc: the second).")
    aggregate: Aggregate = Field(
        "none", description="'count': how many facts match; 'first'/'last': the earliest/latest one.")
    current_only: bool = Field(
        False, description="Only facts still current (the latest object per subject and predicate).")

    @field_validator("subject", "object")
    @classmethod
    def _name_has_words(cls, value: str | None) -> str | None:
        if value is not None and not normalize_name(value):
            raise ValueError("a name needs letters or digits")
        return value

    @field_validator("predicate")
    @classmethod
    def _predicate_has_words(cls, value: str | None) -> str | None:
        if value is not None and not normalize_predicate(value):
            raise ValueError("a predicate needs letters or digits")
        return value


class ReadSegmentArgs(_Args):
    segment_id: str = Field(min_length=1, max_length=300, description="A segment_id from a retrieval result.")


class OutputAnswerArgs(_Args):
    answer: str = Field(max_length=4000, description="The final answer, short.")
    abstain: bool = Field(False, description="True when the memory holds no evidence for an answer.")
    evidence: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        default_factory=list, max_length=MAX_LIMIT,
        description="Ids that support the answer (gist_id, fact_id, turn_id or segment_id).")

    @model_validator(mode="after")
    def _answer_or_abstain(self) -> OutputAnswerArgs:
        if not self.abstain and not self.answer:
            raise ValueError("give an answer, or abstain")
        return self


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    arguments: type[_Args]


_SPECS = (
    ToolSpec("semantic_retrieve", "Find gists or turns close in meaning to a query, optionally within a time range.",
             SemanticRetrieveArgs),
    ToolSpec("lexical_retrieve", "Find gists or turns containing the query's words, optionally within a time range.",
             LexicalRetrieveArgs),
    ToolSpec("find_gist_contexts",
             "Expand a gist: its source turns, neighbouring gists in time, mentioned entities, similar gists.",
             FindGistContextsArgs),
    ToolSpec("find_entity_contexts",
             "Dated facts (subject, predicate, object) by entity, relation and time range; ordered, paged, "
             "counted, or first/last.", FindEntityContextsArgs),
    ToolSpec("read_segment", "Read a segment's raw dialogue, summary and turns.", ReadSegmentArgs),
    ToolSpec("output_answer", "Give the final answer (or abstain) with the ids of the supporting evidence.",
             OutputAnswerArgs),
)
SPECS_BY_NAME: dict[str, ToolSpec] = {spec.name: spec for spec in _SPECS}
TOOL_SPECS: list[dict[str, Any]] = [
    {"name": spec.name, "description": spec.description, "parameters": spec.arguments.model_json_schema()}
    for spec in _SPECS
]


def openai_tools() -> list[dict[str, Any]]:
    """TOOL_SPECS in the OpenAI chat-completions ``tools`` format."""
    return [{"type": "function", "function": dict(spec)} for spec in TOOL_SPECS]


def validate_arguments(name: str, arguments: dict[str, Any] | str | None) -> _Args:
    """The tool's argument model built from ``arguments`` (a dict, or a JSON object text)."""
    spec = SPECS_BY_NAME.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ToolArgumentError(str(name), f"unknown tool; known tools: {', '.join(SPECS_BY_NAME)}")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolArgumentError(name, f"arguments are not JSON: {exc.msg}") from None
    if not isinstance(arguments, dict):
        raise ToolArgumentError(name, "arguments must be a JSON object")
    try:
        return spec.arguments.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'arguments'}: {error['msg']}" for error in exc.errors()
        )
        raise ToolArgumentError(name, f"invalid arguments: {problems}") from None


# --------------------------------------------------------------------------- dates
def period(resolved: ResolvedDate) -> tuple[date, date]:
    """The first and last day a resolved date stands for, at its precision."""
    value = resolved.value
    if resolved.precision == "year":
        return date(value.year, 1, 1), date(value.year, 12, 31)
    if resolved.precision == "month":
        return value.replace(day=1), value.replace(day=calendar.monthrange(value.year, value.month)[1])
    if resolved.precision == "week":
        monday = value - timedelta(days=value.weekday())
        return monday, monday + timedelta(days=6)
    return value, value


def _period_of(tool: str, field: str, text: str, asked_at: datetime) -> tuple[date, date]:
    resolved = resolve(text, asked_at)
    if resolved is None:
        raise ToolArgumentError(tool, f"{field}: cannot read {text!r} as a date (try '2024-05-14', 'May 2024', "
                                      "'2024' or 'last year')")
    return period(resolved)


def resolve_range(tool: str, args: _TimeArgs, asked_at: datetime) -> tuple[date | None, date | None]:
    """[start, end] from the arguments: start opens its period, end closes its own; during sets both.

    With ``during`` and start/end together, the range is their intersection.
    """
    lows: list[date] = []
    highs: list[date] = []
    if args.start is not None:
        lows.append(_period_of(tool, "start", args.start, asked_at)[0])
    if args.end is not None:
        highs.append(_period_of(tool, "end", args.end, asked_at)[1])
    if args.during is not None:
        low, high = _period_of(tool, "during", args.during, asked_at)
        lows.append(low)
        highs.append(high)
    start = max(lows) if lows else None
    end = min(highs) if highs else None
    if start is not None and end is not None and start > end:
        raise ToolArgumentError(tool, f"empty time range: {start.isoformat()} is after {end.isoformat()}")
    return start, end


# --------------------------------------------------------------------------- JSON
def _plain(value: Any, key: str = "") -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), f.name) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, key) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, str):
        cap = MAX_RAW_TEXT_CHARS if key == "raw_text" else MAX_TEXT_CHARS
        return value if len(value) <= cap else value[:cap] + " …[truncated]"
    return value


def _shallow(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(value)}


def _lists(value: Any) -> list[list[Any]]:
    found: list[list[Any]] = []
    if isinstance(value, dict):
        for item in value.values():
            found.extend(_lists(item))
    elif isinstance(value, list):
        if value and isinstance(value[0], dict):
            found.append(value)
        for item in value:
            found.extend(_lists(item))
    return found


def fit(payload: dict[str, Any], max_chars: int = MAX_RESULT_CHARS) -> dict[str, Any]:
    """Drop trailing items of the biggest result lists until the JSON fits ``max_chars``."""
    while len(json.dumps(payload, ensure_ascii=False)) > max_chars:
        candidates = [lst for lst in _lists(payload) if lst]
        if not candidates:
            break
        biggest = max(candidates, key=lambda lst: len(json.dumps(lst, ensure_ascii=False)))
        biggest.pop()
        payload["truncated"] = True
    return payload


# --------------------------------------------------------------------------- dispatch
class _Embeds(Protocol):
    def embed_one(self, text: str) -> np.ndarray: ...


def _range_json(start: date | None, end: date | None) -> dict[str, str | None]:
    return {"start": start.isoformat() if start else None, "end": end.isoformat() if end else None}


async def call_tool(
    conn: AsyncConnection | None,
    name: str,
    arguments: dict[str, Any] | str | None,
    *,
    tenant: str,
    embedder: _Embeds | None,
    conversation_ids: list[str] | None,
    asked_at: datetime | None,
    max_chars: int = MAX_RESULT_CHARS,
) -> dict[str, Any]:
    """Validate a model's tool call, run it inside the caller's tenant scope, return JSON-ready data.

    Raises ToolArgumentError (a ValueError) for an unknown tool or bad arguments, before
    touching the database. ``output_answer`` is only validated and echoed: the caller ends
    the loop with it. ``conversation_ids`` (the question's scope) is the caller's, never the model's.
    """
    args = validate_arguments(name, arguments)
    anchor = asked_at or datetime.now(UTC)
    if isinstance(args, OutputAnswerArgs):
        return {"tool": name, **args.model_dump()}
    start, end = resolve_range(name, args, anchor) if isinstance(args, _TimeArgs) else (None, None)
    if conn is None:
        raise ValueError("call_tool needs a connection for data tools")
    async def retrieve() -> dict[str, Any]:
        assert isinstance(args, SemanticRetrieveArgs)
        if isinstance(args, LexicalRetrieveArgs):
            hits = await lexical_retrieve(conn, tenant=tenant, query=args.query, conversation_ids=conversation_ids,
                                          target=args.target, start=start, end=end, limit=args.limit,
                                          operator=args.operator)
        else:
            if embedder is None:
                raise ValueError("semantic_retrieve needs an embedder")
            vector = await asyncio.to_thread(embedder.embed_one, args.query)
            hits = await semantic_retrieve(conn, tenant=tenant, vector=vector, conversation_ids=conversation_ids,
                                           target=args.target, start=start, end=end, limit=args.limit)
        return {"target": args.target, "range": _range_json(start, end), "results": hits}

    async def gist_contexts() -> dict[str, Any]:
        assert isinstance(args, FindGistContextsArgs)
        found = await find_gist_contexts(conn, tenant=tenant, gist_id=args.gist_id, window=args.window,
                                         conversation_ids=conversation_ids)
        if found is None:
            return {"found": False, "error": f"no gist {args.gist_id!r} in this memory"}
        return {"found": True, **_shallow(found)}

    async def entity_contexts() -> dict[str, Any]:
        assert isinstance(args, FindEntityContextsArgs)
        found = await find_entity_contexts(
            conn, tenant=tenant, subject=args.subject, predicate=args.predicate, object=args.object,
            start=start, end=end, order=args.order, limit=args.limit, offset=args.offset,
            aggregate=args.aggregate, current_only=args.current_only, conversation_ids=conversation_ids)
        return {"range": _range_json(start, end), **_shallow(found)}

    async def segment() -> dict[str, Any]:
        assert isinstance(args, ReadSegmentArgs)
        found = await read_segment(conn, tenant=tenant, segment_id=args.segment_id,
                                   conversation_ids=conversation_ids)
        if found is None:
            return {"found": False, "error": f"no segment {args.segment_id!r} in this memory"}
        return {"found": True, "segment": found}

    runners: dict[type[_Args], Callable[[], Awaitable[dict[str, Any]]]] = {
        SemanticRetrieveArgs: retrieve, LexicalRetrieveArgs: retrieve, FindGistContextsArgs: gist_contexts,
        FindEntityContextsArgs: entity_contexts, ReadSegmentArgs: segment,
    }
    result = await runners[type(args)]()
    return fit({"tool": name, **_plain(result)}, max_chars)
