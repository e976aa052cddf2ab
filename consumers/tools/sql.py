"""SQL shared by the tools: column lists, the conversation-scope filter, the
nearest-gists scan, and running a statement into dict rows.

Every statement the tools run is composed from constant fragments with
psycopg.sql (identifiers through ``sql.Identifier``); every value is a bound
parameter. Each statement also filters on ``tenant`` explicitly, on top of
row-level security.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row

GIST_FIELDS = ("gist_id", "conversation_id", "segment_id", "text", "event_date", "date_precision", "turn_ids",
               "said_at")
TURN_FIELDS = ("conversation_id", "turn_id", "speaker", "text", "ts", "tz_offset_s", "session_id")


def columns(alias: str, names: Iterable[str]) -> sql.Composed:
    """``alias.name, ...`` for the given columns."""
    return sql.SQL(", ").join(sql.Identifier(alias, name) for name in names)


def in_conversations(alias: str) -> sql.Composed:
    """The question's conversation scope (``%(conversations)s``, NULL for all) on ``alias``."""
    return sql.SQL("(%(conversations)s::text[] IS NULL OR {column} = ANY(%(conversations)s))").format(
        column=sql.Identifier(alias, "conversation_id"))


GIST_COLUMNS = columns("g", GIST_FIELDS)
TURN_COLUMNS = columns("t", TURN_FIELDS)


_EVERY_ROW = sql.SQL("true")


def nearest_gists(where: sql.Composable, keep: sql.Composable = _EVERY_ROW) -> sql.Composed:
    """The tenant's gists nearest ``%(vector)s`` (HNSW) that pass ``where``, with ``score`` = cosine.

    hnsw.iterative_scan = relaxed_order (set by the pool) keeps filtered nearest-neighbour
    scans going until LIMIT rows pass; the materialised CTE then restores exact distance
    order, as pgvector recommends. ``keep`` filters the nearest rows (alias ``n``).
    """
    return sql.SQL("""
WITH nearest AS MATERIALIZED (
    SELECT {gist_columns}, g.embedding <=> %(vector)s AS distance
    FROM memory.gists g
    WHERE g.tenant = %(tenant)s AND {where}
    ORDER BY g.embedding <=> %(vector)s
    LIMIT %(limit)s
)
SELECT {nearest_columns}, (1 - n.distance)::float8 AS score
FROM nearest n
WHERE {keep}
ORDER BY n.distance + 0, n.gist_id
""").format(gist_columns=GIST_COLUMNS, nearest_columns=columns("n", GIST_FIELDS), where=where, keep=keep)


def conversations(conversation_ids: list[str] | None) -> list[str] | None:
    """The ``%(conversations)s`` parameter: None (every conversation) for no scope."""
    return list(conversation_ids) if conversation_ids else None


async def rows(conn: AsyncConnection, statement: sql.Composable, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement, params)
        return await cur.fetchall()
