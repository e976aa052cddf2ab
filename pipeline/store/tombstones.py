"""Tombstones: what was forgotten stays forgotten, even when Kafka is replayed."""

from __future__ import annotations

from psycopg import AsyncConnection

WHOLE_TENANT = ""
SELECT_TOMBSTONES = "SELECT conversation_id FROM memory.tombstones WHERE tenant = %s"


async def tombstones(conn: AsyncConnection, tenant: str) -> set[str]:
    cur = await conn.execute(SELECT_TOMBSTONES, (tenant,))
    return {row[0] for row in await cur.fetchall()}


def is_forgotten(forgotten: set[str], conversation_id: str) -> bool:
    return WHOLE_TENANT in forgotten or conversation_id in forgotten
