"""The tools' seed searches: gists or turns by meaning (pgvector HNSW, cosine) or by
words (Postgres full-text, ts_rank_cd), within the question's conversations and an
optional inclusive range of days (``%(start)s``/``%(end)s``, either open).

A gist's date covers its whole period at its precision ("2023-05" is all of May),
so a day range keeps a gist whose period overlaps it. A turn's day is the
speaker's local day (ts shifted by the stored UTC offset).
"""

from __future__ import annotations

from psycopg import sql

from .fragments import (
    ALL_KEYWORDS,
    GIST_COLUMNS,
    GIST_FIELDS,
    KEYWORD_PHRASE,
    TURN_COLUMNS,
    TURN_FIELDS,
    any_keyword,
    in_scope,
    matches,
    nearest_in_order,
    overlaps_window,
    segment_of,
)
from .recipes import KEYWORD_CONFIG

_GIST_PERIOD_START = sql.SQL("date_trunc(g.date_precision, g.event_date::timestamp)")
GIST_IN_RANGE = overlaps_window(
    sql.SQL("{start}::date").format(start=_GIST_PERIOD_START),
    sql.SQL("({start} + ('1 ' || g.date_precision)::interval)::date - 1").format(start=_GIST_PERIOD_START),
    "day")

_TURN_LOCAL_DAY = sql.SQL("(t.ts AT TIME ZONE 'UTC' + make_interval(secs => t.tz_offset_s))::date")
TURN_IN_RANGE = overlaps_window(_TURN_LOCAL_DAY, _TURN_LOCAL_DAY, "day")

# The three query forms the model picks with %(operator)s: any word, all words
# (plainto), the words in sequence (phraseto).
KEYWORD_QUERY = sql.SQL("""(SELECT CASE %(operator)s
                WHEN 'and' THEN {all_keywords}
                WHEN 'phrase' THEN {phrase}
                ELSE {any_keyword}
            END AS query) q""").format(all_keywords=ALL_KEYWORDS, phrase=KEYWORD_PHRASE,
                                       any_keyword=any_keyword(KEYWORD_CONFIG))

SEMANTIC_GISTS = nearest_in_order(
    "gists", "g", GIST_FIELDS, sql.SQL("{scope} AND {in_range}").format(scope=in_scope("g"), in_range=GIST_IN_RANGE),
    tiebreak=("gist_id",))

SEMANTIC_TURNS = nearest_in_order(
    "turns", "t", TURN_FIELDS, sql.SQL("{scope} AND {in_range}").format(scope=in_scope("t"), in_range=TURN_IN_RANGE),
    tiebreak=("conversation_id", "turn_id"), extra=segment_of("n"))

LEXICAL_GISTS = sql.SQL("""
SELECT {gist_columns}, ts_rank_cd(g.tsv, q.query)::float8 AS score
FROM memory.gists g, {keyword_query}
WHERE {matches} AND {scope} AND {in_range}
ORDER BY score DESC, g.event_date, g.gist_id
LIMIT %(limit)s
""").format(gist_columns=GIST_COLUMNS, keyword_query=KEYWORD_QUERY, matches=matches(sql.SQL("g.tsv"), sql.SQL("q.query")),
            scope=in_scope("g"), in_range=GIST_IN_RANGE)

LEXICAL_TURNS = sql.SQL("""
SELECT {turn_columns}, {segment}, ts_rank_cd(t.tsv, q.query)::float8 AS score
FROM memory.turns t, {keyword_query}
WHERE {matches} AND {scope} AND {in_range}
ORDER BY score DESC, t.ts, t.conversation_id, t.turn_id
LIMIT %(limit)s
""").format(turn_columns=TURN_COLUMNS, segment=segment_of("t"), keyword_query=KEYWORD_QUERY,
            matches=matches(sql.SQL("t.tsv"), sql.SQL("q.query")), scope=in_scope("t"), in_range=TURN_IN_RANGE)
