"""Running a composed statement into rows (the package's one way to read): dict rows for a reader that
takes them apart at once, typed rows (``typed_rows``) for rows handed to other modules."""

from __future__ import annotations

from typing import Any, TypeVar

from psycopg import AsyncConnection, sql
from psycopg.rows import class_row, dict_row

T = TypeVar("T")


async def rows(conn: AsyncConnection, statement: sql.SQL | sql.Composed, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement, params)
        return await cur.fetchall()


async def typed_rows(conn: AsyncConnection, row_type: type[T], statement: sql.SQL | sql.Composed,
                     params: dict[str, Any]) -> list[T]:
    """The rows as ``row_type`` (a dataclass whose fields are the statement's columns, by name)."""
    async with conn.cursor(row_factory=class_row(row_type)) as cur:
        await cur.execute(statement, params)
        return await cur.fetchall()
