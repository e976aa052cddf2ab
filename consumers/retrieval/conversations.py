"""The tenant's conversations, a page at a time: the ids that start with a prefix, in id order, with their
turn counts and last turn's time, and (asked) how many match, up to a bound. What the MCP server lists as
resources and offers as completions (consumers/listing.py answers the `conversations` listing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, sql

from epistream.contracts.questions import ConversationPage
from epistream.contracts.replies import ConversationEntry

from .execute import typed_rows

# The tenant's conversations: those with a stored turn (a forgotten one has none), in id order, from the
# (tenant, conversation_id, turn_id) key. starts_with, not LIKE: a prefix's % and _ are no wildcards.
CONVERSATIONS = sql.SQL("""
SELECT t.conversation_id, count(*) AS turns, max(t.ts) AS last_turn_at
FROM memory.turns t
WHERE t.tenant = %(tenant)s AND starts_with(t.conversation_id, %(prefix)s)
  AND (%(after)s::text IS NULL OR t.conversation_id > %(after)s::text)
GROUP BY t.conversation_id
ORDER BY t.conversation_id
LIMIT %(limit)s
""")

CONVERSATIONS_COUNT = sql.SQL("""
SELECT count(*) AS matching FROM (
  SELECT DISTINCT t.conversation_id FROM memory.turns t
  WHERE t.tenant = %(tenant)s AND starts_with(t.conversation_id, %(prefix)s)
  LIMIT %(cap)s
) m
""")

#: The most conversations a count reports; past it the reply's ``total`` is None (more than that).
COUNT_MAX = 10_000


@dataclass(frozen=True)
class _Count:
    matching: int


async def conversations_page(conn: AsyncConnection, tenant: str,
                             page: ConversationPage) -> tuple[list[ConversationEntry], bool, int | None]:
    """A page of the tenant's conversations, whether another follows, and (asked to count) how many match."""
    params: dict[str, Any] = {"tenant": tenant, "prefix": page.prefix, "after": page.after, "limit": page.limit + 1}
    rows = await typed_rows(conn, ConversationEntry, CONVERSATIONS, params)
    total = None
    if page.count:
        counted = await typed_rows(conn, _Count, CONVERSATIONS_COUNT,
                                   {"tenant": tenant, "prefix": page.prefix, "cap": COUNT_MAX + 1})
        total = counted[0].matching if counted[0].matching <= COUNT_MAX else None
    return rows[: page.limit], len(rows) > page.limit, total
