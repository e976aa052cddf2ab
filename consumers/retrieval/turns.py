"""Turn reads: fused turn search (lexical full-text and dense HNSW pathways fused by
reciprocal rank, computed in PostgreSQL on its indexes), and a conversation's turns by id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache

import numpy as np
from psycopg import AsyncConnection, sql
from psycopg.rows import class_row

from epistream.core import tracing

from .execute import rows, typed_rows
from .fragments import (
    TURN_IN_WINDOW,
    TurnOrder,
    columns,
    conversations,
    in_scope,
    nearest,
    segment_of,
    turns_by_id,
)
from .recipes import TurnRecipe

#: Okapi BM25's term-frequency saturation and length normalisation (the usual values).
BM25_K1, BM25_B = 1.2, 0.75

#: What each pathway carries of its turns, for the fused rows (no second read of memory.turns).
CARRIED = ("tenant", "conversation_id", "turn_id", "speaker", "text", "ts", "session_id", "tz_offset_s")


def lexical_turns() -> sql.Composed:
    """The turns matching any of the question's words, best ``%(pool)s`` first.

    Okapi BM25 over the stored tsvector, each word weighted by how rare it is among the
    tenant's turns in scope: its document frequency and the turns in scope are read from
    memory.term_counts (sql/015, kept by triggers), one index probe per word, so the weights cost the
    same in a conversation of 100 turns or 200,000. A turn is short, so a word is counted once per
    turn (tf 1: no unnesting of every matched tsvector). PostgreSQL's own
    ``ts_rank_cd`` weighs every word alike, so "time" counts as much as "Stromboli": on the pick split
    the context read reached 0.777 with it at 1,000 tokens against 0.801 (docs/experiments.md).

    Only the rarest words *find* turns: taken rarest first while the turns they match together stay
    within ``%(match_cap)s`` (0: every word), the rarest always, its own matches capped too. A common
    word still adds its weight to the turns found, but no longer pulls in every turn of a large
    conversation that says "really" (the cost grew with the conversation: bench.scale).
    """
    return sql.SQL("""WITH terms AS (
              SELECT DISTINCT w.lexeme, plainto_tsquery('simple', w.lexeme) AS tq
              FROM unnest(to_tsvector('english', %(query)s)) AS w
          ), population AS MATERIALIZED (  -- the '' row of a conversation counts its turns
              SELECT coalesce(sum(c.turns), 0) AS n FROM memory.term_counts c WHERE c.lexeme = '' AND {counted}
          ), weights AS MATERIALIZED (  -- read once, not once per matched turn
              SELECT terms.lexeme, terms.tq, frequency.df,
                     ln(1 + (greatest(population.n, frequency.df) - frequency.df + 0.5) / (frequency.df + 0.5)) AS idf
              FROM terms CROSS JOIN population
              CROSS JOIN LATERAL (SELECT coalesce(sum(c.turns), 0) AS df FROM memory.term_counts c
                                  WHERE c.lexeme = terms.lexeme AND {counted}) frequency
              WHERE numnode(terms.tq) > 0
          ), searched AS MATERIALIZED (  -- the rarest words while the turns they match fit the cap
              SELECT r.tq FROM (SELECT w.tq, sum(w.df) OVER (ORDER BY w.df, w.lexeme) AS running,
                                       row_number() OVER (ORDER BY w.df, w.lexeme) AS place
                                FROM weights w WHERE w.df > 0) r
              WHERE %(match_cap)s::int = 0 OR r.running <= %(match_cap)s::int OR r.place = 1
          ), matched AS MATERIALIZED (
              SELECT DISTINCT ON (t.tenant, t.conversation_id, t.turn_id) {carried}, t.tsv, length(t.tsv) AS len
              FROM searched s CROSS JOIN LATERAL (
                  SELECT {carried}, t.tsv FROM memory.turns t
                  WHERE %(use_lexical)s AND t.tsv @@ s.tq AND {scope} AND {in_window}
                  LIMIT nullif(%(match_cap)s::int, 0)) t
          ), norms AS MATERIALIZED (  -- once: inlined, the planner re-averaged every matched turn per turn
              SELECT greatest(avg(len), 1) AS avgdl FROM matched
          )
          SELECT {matched_carried}
          FROM matched m CROSS JOIN norms
          CROSS JOIN LATERAL (SELECT sum(w.idf) AS idf FROM weights w WHERE m.tsv @@ w.tq) words
          ORDER BY words.idf * ({k1} + 1) / (1 + {k1} * (1 - {b} + {b} * m.len / norms.avgdl)) DESC, m.ts
          LIMIT %(pool)s""").format(
        scope=in_scope("t"), counted=in_scope("c"), in_window=TURN_IN_WINDOW, k1=sql.Literal(BM25_K1),
        b=sql.Literal(BM25_B), carried=columns("t", CARRIED), matched_carried=columns("m", CARRIED))


@cache
def fused_turn_search() -> sql.Composed:
    """Each pathway takes its own top ``%(pool)s`` on its own index (within the time window),
    then their ranks are fused; a turn by one of ``%(speakers)s`` (case-folded) gains ``%(speaker_bonus)s``."""
    return sql.SQL("""
WITH dense AS MATERIALIZED (
    SELECT d.*, row_number() OVER () AS rnk
    FROM ({dense}) d
), lexical AS MATERIALIZED (
    SELECT l.*, row_number() OVER () AS rnk
    FROM ({lexical}) l
), fused AS MATERIALIZED (  -- each pathway carries its turns' columns: no join back to memory.turns, whose
    SELECT coalesce(d.tenant, l.tenant) AS tenant,  -- probes the planner, misled by the CTEs' row estimates,
           coalesce(d.conversation_id, l.conversation_id) AS conversation_id,  -- made scan half a conversation
           coalesce(d.turn_id, l.turn_id) AS turn_id, coalesce(d.speaker, l.speaker) AS speaker,
           coalesce(d.text, l.text) AS text, coalesce(d.ts, l.ts) AS ts,
           CASE WHEN d.turn_id IS NULL THEN l.session_id ELSE d.session_id END AS session_id,
           coalesce(d.tz_offset_s, l.tz_offset_s) AS tz_offset_s,
           d.rnk AS dense_rank, l.rnk AS lexical_rank,
           coalesce(1.0 / (%(rrf_k)s + d.rnk), 0) + coalesce(1.0 / (%(rrf_k)s + l.rnk), 0) AS score
    FROM dense d FULL JOIN lexical l USING (tenant, conversation_id, turn_id)
)
SELECT t.conversation_id, t.turn_id, t.speaker, t.text, t.ts, t.session_id,
       (t.score + CASE WHEN lower(t.speaker) = ANY(%(speakers)s::text[]) THEN %(speaker_bonus)s ELSE 0 END
       )::float8 AS score, t.dense_rank, t.lexical_rank, t.tz_offset_s, {segment}
FROM fused t
ORDER BY score DESC, t.ts
LIMIT %(top_k)s
""").format(
        dense=nearest("turns", "t", columns("t", CARRIED),
                      sql.SQL("%(use_dense)s AND {scope} AND {in_window}").format(
                          scope=in_scope("t"), in_window=TURN_IN_WINDOW, segment=segment_of("t")), limit="pool"),
        lexical=lexical_turns(), segment=segment_of("t"))


#: pgvector's default hnsw.ef_search and its largest value.
EF_SEARCH_DEFAULT, EF_SEARCH_MAX = 40, 1_000
SEARCH_WIDTH = "SELECT set_config('hnsw.ef_search', %s, true)"  # for this transaction


def search_width(pool: int) -> int:
    """hnsw.ef_search for a dense pathway taking ``pool`` turns: twice the pool, within pgvector's bounds
    (re-read at 100K, one 19,600-turn conversation: recall against exact 0.942 at the pool, 0.985 at
    twice it, latency unchanged; docs/experiments.md)."""
    return min(EF_SEARCH_MAX, max(EF_SEARCH_DEFAULT, 2 * pool))


@dataclass(frozen=True)
class RetrievedTurn:
    conversation_id: str
    turn_id: str
    speaker: str
    text: str
    ts: datetime
    session_id: str | None
    score: float
    dense_rank: int | None
    lexical_rank: int | None
    tz_offset_s: int = 0  # the UTC offset the turn was stamped with (its speaker's local time)
    segment_id: str | None = None  # the first segment holding it (None: not yet in a closed one)


async def search_turns(
    conn: AsyncConnection,
    *,
    tenant: str,
    query: str,
    vector: np.ndarray,
    conversation_ids: list[str] | None,
    recipe: TurnRecipe,
    start: datetime | None = None,
    end: datetime | None = None,
    speakers: Sequence[str] = (),
) -> list[RetrievedTurn]:
    """The recipe's best turns said within [start, end) (None: open), best first; turns by
    ``speakers`` (case-folded names the question gives: retrieval.speakers) gain the recipe's
    speaker bonus. Run inside ``tenant_scope(conn, tenant)``."""
    params = {
        "tenant": tenant,
        "query": query,
        "vector": vector,
        "conversations": conversations(conversation_ids),
        "top_k": recipe.top_k,
        "pool": recipe.pool,
        "rrf_k": recipe.rrf_k,
        "use_dense": "dense" in recipe.pathways,
        "use_lexical": "lexical" in recipe.pathways,
        "match_cap": recipe.match_cap,
        "start": start,
        "end": end,
        "speakers": list(speakers),
        "speaker_bonus": recipe.speaker_bonus,
    }
    async with conn.cursor(row_factory=class_row(RetrievedTurn)) as cur:
        # The HNSW scan keeps ef_search candidates; with fewer than the pool, the rest came from iterative
        # scanning's looser later rounds (see search_width).
        await cur.execute(SEARCH_WIDTH, (str(search_width(recipe.pool)),))
        await cur.execute(fused_turn_search(), params)
        return await cur.fetchall()


# The turns just before and after each seed in its conversation (by time, then id), within the window:
# evidence often spans a question and its answer, or a statement and its follow-up.
NEIGHBOURS = sql.SQL("""
SELECT n.conversation_id, n.turn_id, n.speaker, n.text, n.ts, n.session_id, 0.0::float8 AS score,
       NULL::int AS dense_rank, NULL::int AS lexical_rank, n.tz_offset_s, {segment}, s.ord AS seed
FROM unnest(%(seed_conversations)s::text[], %(seed_turns)s::text[]) WITH ORDINALITY AS s(conversation_id, turn_id, ord)
JOIN memory.turns st ON st.tenant = %(tenant)s AND st.conversation_id = s.conversation_id AND st.turn_id = s.turn_id
CROSS JOIN LATERAL (
    (SELECT t.* FROM memory.turns t
     WHERE t.tenant = %(tenant)s AND t.conversation_id = st.conversation_id AND (t.ts, t.turn_id) < (st.ts, st.turn_id)
       AND {in_window}
     ORDER BY t.ts DESC, t.turn_id DESC LIMIT %(each_side)s)
    UNION ALL
    (SELECT t.* FROM memory.turns t
     WHERE t.tenant = %(tenant)s AND t.conversation_id = st.conversation_id AND (t.ts, t.turn_id) > (st.ts, st.turn_id)
       AND {in_window}
     ORDER BY t.ts, t.turn_id LIMIT %(each_side)s)
) n
ORDER BY s.ord, n.ts
""").format(segment=segment_of("n"), in_window=TURN_IN_WINDOW)


# Turns by (conversation, id), each with the place of what pointed at it (a gist's source turns).
TURNS_AT = sql.SQL("""
SELECT t.conversation_id, t.turn_id, t.speaker, t.text, t.ts, t.session_id, 0.0::float8 AS score,
       NULL::int AS dense_rank, NULL::int AS lexical_rank, t.tz_offset_s, {segment}, s.ord AS seed
FROM unnest(%(seed_conversations)s::text[], %(seed_turns)s::text[], %(seed_ords)s::int[])
     AS s(conversation_id, turn_id, ord)
JOIN memory.turns t ON t.tenant = %(tenant)s AND t.conversation_id = s.conversation_id AND t.turn_id = s.turn_id
WHERE {in_window}
ORDER BY s.ord, t.ts
""").format(segment=segment_of("t"), in_window=TURN_IN_WINDOW)


@dataclass(frozen=True)
class NeighbourTurn:
    """A turn beside a seed (``seed``: the seed's 1-based place in the list asked about)."""

    turn: RetrievedTurn
    seed: int


@tracing.traced("retrieve neighbours")
async def neighbour_turns(conn: AsyncConnection, *, tenant: str, seeds: list[RetrievedTurn], each_side: int = 1,
                          start: datetime | None = None, end: datetime | None = None) -> list[NeighbourTurn]:
    """Up to ``each_side`` turns before and after each seed, said within [start, end). Run inside
    ``tenant_scope(conn, tenant)``."""
    if not seeds or each_side <= 0:
        return []
    params = {"tenant": tenant, "seed_conversations": [t.conversation_id for t in seeds],
              "seed_turns": [t.turn_id for t in seeds], "each_side": each_side, "start": start, "end": end}
    found = await rows(conn, NEIGHBOURS, params)
    return [NeighbourTurn(RetrievedTurn(**{k: v for k, v in r.items() if k != "seed"}), int(r["seed"])) for r in found]


@tracing.traced("retrieve gist sources")
async def turns_at(conn: AsyncConnection, *, tenant: str, wanted: list[tuple[str, str, int]],
                   start: datetime | None = None, end: datetime | None = None) -> list[NeighbourTurn]:
    """The turns ``wanted`` as (conversation id, turn id, place of what pointed at it), said within
    [start, end); a turn forgotten or outside the window is left out. Run inside ``tenant_scope``."""
    if not wanted:
        return []
    params = {"tenant": tenant, "seed_conversations": [w[0] for w in wanted], "seed_turns": [w[1] for w in wanted],
              "seed_ords": [w[2] for w in wanted], "start": start, "end": end}
    found = await rows(conn, TURNS_AT, params)
    return [NeighbourTurn(RetrievedTurn(**{k: v for k, v in r.items() if k != "seed"}), int(r["seed"])) for r in found]


@dataclass(frozen=True)
class TurnRow:
    """A turn as stored, by TURN_FIELDS (fragments.turns_by_id); ``ts`` in UTC, ``tz_offset_s`` its speaker's offset."""

    conversation_id: str
    turn_id: str
    speaker: str
    text: str
    ts: datetime
    tz_offset_s: int
    session_id: str | None


async def load_turns(conn: AsyncConnection, *, tenant: str, conversation_id: str, turn_ids: list[str] | tuple[str, ...],
                     order: TurnOrder = "time") -> list[TurnRow]:
    """A conversation's turns by id, in time order or as listed."""
    return await typed_rows(conn, TurnRow, turns_by_id(order), {"tenant": tenant, "conversation_id": conversation_id,
                                                                "turn_ids": list(turn_ids)})
