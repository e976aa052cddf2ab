"""Running a composed statement into dict rows (the package's one way to read)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row


async def rows(conn: AsyncConnection, statement: sql.SQL | sql.Composed, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement, params)
        return await cur.fetchall()
