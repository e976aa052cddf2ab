"""The SQL fragments every read of the memory is composed from, each written once.

Composed with psycopg.sql: identifiers through ``sql.Identifier``, every value a
bound, named parameter (``%(tenant)s``, ``%(conversations)s``, ``%(start)s``,
``%(end)s``, ``%(query)s``, ``%(vector)s``, ``%(conversation_id)s``, ``%(turn_ids)s``).
The one inlined constant is a text-search configuration's name, a catalog object
checked against a closed set, like an identifier.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

from psycopg import sql

from epistream.storage.db import CONNECTION_EMBEDDER

TextSearchConfig = Literal["english", "simple"]
WindowUnit = Literal["instant", "day"]
TurnOrder = Literal["time", "listed"]

GIST_FIELDS = ("gist_id", "conversation_id", "segment_id", "text", "event_date", "date_precision", "turn_ids",
               "said_at")
TURN_FIELDS = ("conversation_id", "turn_id", "speaker", "text", "ts", "tz_offset_s", "session_id")

EVERY_ROW = sql.SQL("true")


def columns(alias: str, names: Iterable[str]) -> sql.Composed:
    """``alias.name, ...`` for the given columns."""
    return sql.SQL(", ").join(sql.Identifier(alias, name) for name in names)


GIST_COLUMNS = columns("g", GIST_FIELDS)
TURN_COLUMNS = columns("t", TURN_FIELDS)


# --- scope --------------------------------------------------------------------------------

def of_tenant(alias: str) -> sql.Composed:
    """The caller's tenant, filtered explicitly on top of row-level security."""
    return sql.SQL("{column} = %(tenant)s").format(column=sql.Identifier(alias, "tenant"))


def in_conversations(alias: str) -> sql.Composed:
    """The question's conversation scope (``%(conversations)s``, NULL for all) on ``alias``."""
    return sql.SQL("(%(conversations)s::text[] IS NULL OR {column} = ANY(%(conversations)s))").format(
        column=sql.Identifier(alias, "conversation_id"))


def in_scope(alias: str) -> sql.Composed:
    """The tenant's rows in the question's conversations."""
    return sql.SQL("{tenant} AND {conversations}").format(tenant=of_tenant(alias),
                                                          conversations=in_conversations(alias))


def conversations(conversation_ids: list[str] | None) -> list[str] | None:
    """The ``%(conversations)s`` parameter: None (every conversation) for no scope."""
    return list(conversation_ids) if conversation_ids else None


# --- time ---------------------------------------------------------------------------------

def overlaps_window(first: sql.Composable, last: sql.Composable, unit: WindowUnit) -> sql.Composed:
    """A row whose span [first, last] meets the window [%(start)s, %(end)s]; a NULL bound is open.

    ``instant``: timestamps, the window half-open [start, end) (``timefilter.DateRange``), a
    point in time being a span with first = last. ``day``: dates, the window inclusive
    [start, end] (the tools' day ranges).
    """
    cast, before_end = {"instant": ("timestamptz", "<"), "day": ("date", "<=")}[unit]
    return sql.SQL("(%(start)s::{cast} IS NULL OR {last} >= %(start)s)"
                   " AND (%(end)s::{cast} IS NULL OR {first} {before_end} %(end)s)").format(
        cast=sql.SQL(cast), first=first, last=last, before_end=sql.SQL(before_end))


def fact_days(alias: str) -> tuple[sql.Composed, sql.Composed]:
    """A fact's span as days (first, last) for ``overlaps_window(..., "day")``: [point_in_time] for
    an event; [start_time, end_time] for a period, open-ended where a bound is missing; the day it
    was said when undated."""
    def column(name: str) -> sql.Identifier:
        return sql.Identifier(alias, name)

    first = sql.SQL("CASE WHEN {p} IS NOT NULL THEN {p} WHEN {s} IS NOT NULL THEN {s}"
                    " WHEN {e} IS NOT NULL THEN '-infinity'::date ELSE {said}::date END")
    last = sql.SQL("CASE WHEN {p} IS NOT NULL THEN {p} WHEN {e} IS NOT NULL THEN {e}"
                   " WHEN {s} IS NOT NULL THEN 'infinity'::date ELSE {said}::date END")
    names = {"p": column("point_in_time"), "s": column("start_time"), "e": column("end_time"),
             "said": column("said_at")}
    return first.format(**names), last.format(**names)


def span_columns(first: sql.Composable, last: sql.Composable) -> sql.Composed:
    """A span's days selected as ``first_day`` and ``last_day`` (NULL where open): a reader marks what is
    about a period by the same span the window filter uses."""
    return sql.SQL("NULLIF({first}, '-infinity'::date) AS first_day, NULLIF({last}, 'infinity'::date) AS last_day"
                   ).format(first=first, last=last)


def gist_days(alias: str) -> tuple[sql.Composed, sql.Composed]:
    """A gist's event as days (first, last): the day, week, month or year its date stands for."""
    fields = {"precision": sql.Identifier(alias, "date_precision"), "date": sql.Identifier(alias, "event_date")}
    first = sql.SQL("date_trunc({precision}, {date}::timestamp)::date").format(**fields)
    last = sql.SQL("(date_trunc({precision}, {date}::timestamp) + ('1 ' || {precision})::interval)::date - 1").format(
        **fields)
    return first, last


#: A turn (alias ``t``) said within the window [%(start)s, %(end)s).
TURN_IN_WINDOW = overlaps_window(sql.SQL("t.ts"), sql.SQL("t.ts"), "instant")


# --- words --------------------------------------------------------------------------------

ALL_KEYWORDS = sql.SQL("plainto_tsquery('english', %(query)s)")
KEYWORD_PHRASE = sql.SQL("phraseto_tsquery('english', %(query)s)")


def any_keyword(config: TextSearchConfig) -> sql.Composed:
    """The question's lexemes OR-ed (plainto_tsquery alone ANDs them: too strict to rank with).

    The text of a tsquery is valid tsquery input, read again under ``config``. 'simple' keeps
    plainto_tsquery's lexemes as they are; 'english' stems them a second time (sunrise -> 'sunris'
    -> 'sunri', which no stored text holds: 67 of the 760 LoCoMo dev questions), kept only as the
    ablation of that old behaviour (bench.budget_recall's ``*_english_restem`` systems).
    """
    if config not in get_args(TextSearchConfig):
        raise ValueError(f"text-search configuration must be one of {get_args(TextSearchConfig)}, not {config!r}")
    return sql.SQL("to_tsquery({config}, replace({all_keywords}::text, ' & ', ' | '))").format(
        config=sql.Literal(config), all_keywords=ALL_KEYWORDS)


def matches(tsv: sql.Composable, query: sql.Composable) -> sql.Composed:
    """A full-text match; a query of stop words only (no nodes) matches nothing."""
    return sql.SQL("numnode({query}) > 0 AND {tsv} @@ {query}").format(tsv=tsv, query=query)


# --- nearest by meaning -------------------------------------------------------------------

def nearest(table: str, alias: str, selected: sql.Composable, where: sql.Composable, *,
            limit: str = "limit", embedding: str = "embedding") -> sql.Composed:
    """The rows of ``memory.<table>`` passing ``where`` nearest ``%(vector)s`` (HNSW, cosine),
    with their ``distance``, in the index's order. Only vectors of the connection's embedding model
    (sql/018): during a switch of models, rows not yet re-embedded are found lexically only."""
    column = sql.Identifier(alias, embedding)
    return sql.SQL("SELECT {selected}, {column} <=> %(vector)s AS distance FROM {table} {alias}"
                   " WHERE {where} AND {model} = {connection_model}"
                   " ORDER BY {column} <=> %(vector)s LIMIT {limit}").format(
        selected=selected, column=column, table=sql.Identifier("memory", table), alias=sql.Identifier(alias),
        where=where, model=sql.Identifier(alias, "embedded_by"), connection_model=CONNECTION_EMBEDDER,
        limit=sql.Placeholder(limit))


def nearest_in_order(table: str, alias: str, fields: tuple[str, ...], where: sql.Composable, *,
                     tiebreak: tuple[str, ...], extra: sql.Composable | None = None,
                     keep: sql.Composable = EVERY_ROW) -> sql.Composed:
    """``nearest`` up to ``%(limit)s`` rows, with ``score`` = cosine, in exact distance order.

    hnsw.iterative_scan = relaxed_order (set by the pool) keeps filtered nearest-neighbour
    scans going until LIMIT rows pass; the materialised CTE then restores exact distance
    order, as pgvector recommends. ``keep`` filters the nearest rows (alias ``n``);
    ``extra`` adds columns computed on them.
    """
    selected = columns("n", fields) if extra is None else sql.SQL("{}, {}").format(columns("n", fields), extra)
    return sql.SQL("""
WITH nearest AS MATERIALIZED ({nearest})
SELECT {selected}, (1 - n.distance)::float8 AS score
FROM nearest n
WHERE {keep}
ORDER BY n.distance + 0, {tiebreak}
""").format(nearest=nearest(table, alias, columns(alias, fields), where), selected=selected, keep=keep,
            tiebreak=columns("n", tiebreak))


# --- turns --------------------------------------------------------------------------------

def segment_of(alias: str) -> sql.Composed:
    """The first segment holding the turn ``alias`` (``segment_id``; None: not yet in a closed one), for
    read_segment. Only the few segments that started last by the turn's time can hold it (the one it was
    cut into, and the next when it repeats it as overlap), read on segments_time_idx: a few index entries
    however long the conversation. (Reading its segments in seq order until one held the turn grew with
    the conversation: 22 us a turn at 630 turns, one probe per turn a read returns.)"""
    return sql.SQL("""(SELECT s.segment_id FROM (
            SELECT s.segment_id, s.seq, s.turn_ids, s.end_ts FROM memory.segments s
            WHERE s.tenant = %(tenant)s AND s.conversation_id = {conversation} AND s.start_ts <= {ts}
            ORDER BY s.start_ts DESC LIMIT 4) s
        WHERE s.end_ts >= {ts} AND s.turn_ids @> ARRAY[{turn}]
        ORDER BY s.seq LIMIT 1) AS segment_id""").format(
        conversation=sql.Identifier(alias, "conversation_id"), turn=sql.Identifier(alias, "turn_id"),
        ts=sql.Identifier(alias, "ts"))


def turns_by_id(order: TurnOrder) -> sql.Composed:
    """A conversation's turns (``%(conversation_id)s``) by id (``%(turn_ids)s``), with TURN_FIELDS:
    in time order, or in the order listed (a segment's own order)."""
    if order == "listed":
        source = sql.SQL("""unnest(%(turn_ids)s::text[]) WITH ORDINALITY AS ids(turn_id, position)
JOIN memory.turns t ON t.tenant = %(tenant)s AND t.conversation_id = %(conversation_id)s AND t.turn_id = ids.turn_id""")
        return sql.SQL("SELECT {columns}\nFROM {source}\nORDER BY ids.position").format(
            columns=TURN_COLUMNS, source=source)
    return sql.SQL("""SELECT {columns}
FROM memory.turns t
WHERE t.tenant = %(tenant)s AND t.conversation_id = %(conversation_id)s AND t.turn_id = ANY(%(turn_ids)s)
ORDER BY t.ts, t.turn_id""").format(columns=TURN_COLUMNS)
