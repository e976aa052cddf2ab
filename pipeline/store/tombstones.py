"""Tombstones: what was forgotten stays forgotten, even when Kafka is replayed, and
even when a writer races the forget.

One guard for every writer of a conversation's rows (ingest: turns, segmenter
state, segments; enrichment: gists, facts, entities, graph): inside the writer's
transaction, `guard` takes transaction-level advisory locks in SHARED mode, on
the tenant and then on each conversation, and only then reads the tombstones.
`exclude_writers`, called by forget first in its transaction, takes the same
locks EXCLUSIVELY (the conversation's, or for a whole tenant the tenant's). So
a writer either commits before the forget starts deleting (and the forget,
whose later statements see its rows, deletes them) or waits for the forget to
commit and then sees the tombstone (and writes nothing). Both sides take the
tenant key before a conversation key, so the order is fixed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import LiteralString

from psycopg import AsyncConnection

WHOLE_TENANT = ""
SELECT_COVERING = "SELECT conversation_id FROM memory.tombstones WHERE tenant = %s AND conversation_id = ANY(%s)"
# A 64-bit key from (tenant, conversation), hashed in SQL from bound parameters: the length
# prefix keeps ("ab", "c") and ("a", "bc") apart, the seed keeps these keys off other uses.
_KEY = "hashtextextended(length(%s)::text || ':' || %s || %s, 7011)"
LOCK_SHARED: LiteralString = "SELECT pg_advisory_xact_lock_shared(" + _KEY + ")"
LOCK_EXCLUSIVE: LiteralString = "SELECT pg_advisory_xact_lock(" + _KEY + ")"


def is_forgotten(forgotten: set[str], conversation_id: str) -> bool:
    return WHOLE_TENANT in forgotten or conversation_id in forgotten


async def guard(conn: AsyncConnection, tenant: str, conversation_ids: Iterable[str]) -> set[str]:
    """Call inside the writer's transaction, before it writes: holds off any forget of these
    conversations (or of the tenant) until this transaction ends, and returns the tombstones
    that cover them (test with `is_forgotten`); write nothing for those."""
    wanted = sorted(set(conversation_ids))
    await _lock(conn, LOCK_SHARED, tenant, WHOLE_TENANT)
    for conversation_id in wanted:
        await _lock(conn, LOCK_SHARED, tenant, conversation_id)
    # Read after the locks: under READ COMMITTED this statement sees any forget that got them first.
    cur = await conn.execute(SELECT_COVERING, (tenant, [WHOLE_TENANT, *wanted]))
    return {row[0] for row in await cur.fetchall()}


async def exclude_writers(conn: AsyncConnection, tenant: str, conversation_id: str | None) -> None:
    """Call first in the forget's transaction: waits for writers of the conversation (or, with
    None, of the whole tenant) that hold the guard, and keeps new ones out until it commits."""
    if conversation_id is None:
        await _lock(conn, LOCK_EXCLUSIVE, tenant, WHOLE_TENANT)
        return
    await _lock(conn, LOCK_SHARED, tenant, WHOLE_TENANT)
    await _lock(conn, LOCK_EXCLUSIVE, tenant, conversation_id)


async def _lock(conn: AsyncConnection, statement: LiteralString, tenant: str, conversation_id: str) -> None:
    await conn.execute(statement, (tenant, tenant, conversation_id))
