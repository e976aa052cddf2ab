"""Seed retrieval: gists or turns by meaning (pgvector HNSW, cosine) or by words
(Postgres full-text, ts_rank_cd), within the question's conversations and an
optional inclusive range of days.

A gist's date covers its whole period at its precision ("2023-05" is all of May),
so a time filter keeps a gist whose period overlaps [start, end]. A turn's day is
the speaker's local day (ts shifted by the stored UTC offset).
"""

from __future__ import annotations

from datetime import date

import numpy as np
from psycopg import AsyncConnection, sql

from .limits import Operator, Target
from .results import GistHit, TurnHit
from .sql import GIST_COLUMNS, TURN_COLUMNS, TURN_FIELDS, columns, conversations, in_conversations, nearest_gists, rows

GIST_IN_RANGE = sql.SQL("""(%(end)s::date IS NULL OR date_trunc(g.date_precision, g.event_date::timestamp)::date <= %(end)s)
      AND (%(start)s::date IS NULL OR (date_trunc(g.date_precision, g.event_date::timestamp)
                                       + ('1 ' || g.date_precision)::interval)::date > %(start)s)""")

_TURN_LOCAL_DAY = sql.SQL("(t.ts AT TIME ZONE 'UTC' + make_interval(secs => t.tz_offset_s))::date")
TURN_IN_RANGE = sql.SQL("""(%(start)s::date IS NULL OR {day} >= %(start)s)
      AND (%(end)s::date IS NULL OR {day} <= %(end)s)""").format(day=_TURN_LOCAL_DAY)


def _segment_of(alias: str) -> sql.Composed:
    """The first segment holding the turn ``alias``, for read_segment."""
    return sql.SQL("""(SELECT s.segment_id FROM memory.segments s
        WHERE s.tenant = %(tenant)s AND s.conversation_id = {conversation} AND s.turn_ids @> ARRAY[{turn}]
        ORDER BY s.seq LIMIT 1) AS segment_id""").format(
        conversation=sql.Identifier(alias, "conversation_id"), turn=sql.Identifier(alias, "turn_id"))


# The three query forms: any word (plainto's lexemes OR-ed: the text of a tsquery
# is valid tsquery input, and 'simple' keeps its lexemes as they are), all words
# (plainto), the words in sequence (phraseto).
TSQUERY = sql.SQL("""(SELECT CASE %(operator)s
                WHEN 'and' THEN plainto_tsquery('english', %(query)s)
                WHEN 'phrase' THEN phraseto_tsquery('english', %(query)s)
                ELSE to_tsquery('simple', replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | '))
            END AS query) q""")

SEMANTIC_GISTS = nearest_gists(sql.SQL("{conversations} AND {in_range}").format(
    conversations=in_conversations("g"), in_range=GIST_IN_RANGE))

SEMANTIC_TURNS = sql.SQL("""
WITH nearest AS MATERIALIZED (
    SELECT {turn_columns}, t.embedding <=> %(vector)s AS distance
    FROM memory.turns t
    WHERE t.tenant = %(tenant)s AND {conversations} AND {in_range}
    ORDER BY t.embedding <=> %(vector)s
    LIMIT %(limit)s
)
SELECT {nearest_columns}, {segment}, (1 - n.distance)::float8 AS score
FROM nearest n
ORDER BY n.distance + 0, n.conversation_id, n.turn_id
""").format(turn_columns=TURN_COLUMNS, nearest_columns=columns("n", TURN_FIELDS), segment=_segment_of("n"),
            conversations=in_conversations("t"), in_range=TURN_IN_RANGE)

LEXICAL_GISTS = sql.SQL("""
SELECT {gist_columns}, ts_rank_cd(g.tsv, q.query)::float8 AS score
FROM memory.gists g, {tsquery}
WHERE numnode(q.query) > 0 AND g.tsv @@ q.query AND g.tenant = %(tenant)s
  AND {conversations} AND {in_range}
ORDER BY score DESC, g.event_date, g.gist_id
LIMIT %(limit)s
""").format(gist_columns=GIST_COLUMNS, tsquery=TSQUERY, conversations=in_conversations("g"), in_range=GIST_IN_RANGE)

LEXICAL_TURNS = sql.SQL("""
SELECT {turn_columns}, {segment}, ts_rank_cd(t.tsv, q.query)::float8 AS score
FROM memory.turns t, {tsquery}
WHERE numnode(q.query) > 0 AND t.tsv @@ q.query AND t.tenant = %(tenant)s
  AND {conversations} AND {in_range}
ORDER BY score DESC, t.ts, t.conversation_id, t.turn_id
LIMIT %(limit)s
""").format(turn_columns=TURN_COLUMNS, segment=_segment_of("t"), tsquery=TSQUERY,
            conversations=in_conversations("t"), in_range=TURN_IN_RANGE)


def _check_target(target: str) -> None:
    if target not in ("gists", "turns"):
        raise ValueError(f"target must be 'gists' or 'turns', not {target!r}")


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
    params = {"tenant": tenant, "vector": vector, "conversations": conversations(conversation_ids),
              "start": start, "end": end, "limit": limit}
    if target == "gists":
        return [GistHit.from_row(r) for r in await rows(conn, SEMANTIC_GISTS, params)]
    return [TurnHit.from_row(r) for r in await rows(conn, SEMANTIC_TURNS, params)]


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
    params = {"tenant": tenant, "query": query, "operator": operator,
              "conversations": conversations(conversation_ids), "start": start, "end": end, "limit": limit}
    if target == "gists":
        return [GistHit.from_row(r) for r in await rows(conn, LEXICAL_GISTS, params)]
    return [TurnHit.from_row(r) for r in await rows(conn, LEXICAL_TURNS, params)]
