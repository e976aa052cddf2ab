"""Fast mode's read of the structured memory: the gists nearest the question, and
the facts about entities it names (whole words of the normalised question)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from psycopg import AsyncConnection, sql

from .execute import rows
from .fragments import conversations, in_scope, nearest

NEAREST_GISTS = nearest("gists", "g", sql.SQL(
    "g.gist_id, g.conversation_id, g.segment_id, g.text, g.turn_ids, g.said_at"), in_scope("g"))

FACTS_NAMED = sql.SQL("""
SELECT f.fact_id, f.conversation_id, f.segment_id, s.name AS subject, f.predicate, o.name AS object,
       f.point_in_time, f.start_time, f.end_time, f.turn_ids, f.said_at
FROM memory.facts f
JOIN memory.entities s ON s.tenant = f.tenant AND s.entity_id = f.subject_id
JOIN memory.entities o ON o.tenant = f.tenant AND o.entity_id = f.object_id
WHERE {scope}
  AND ((length(s.normalized_name) > 2 AND %(padded)s LIKE '%% ' || s.normalized_name || ' %%')
    OR (length(o.normalized_name) > 2 AND %(padded)s LIKE '%% ' || o.normalized_name || ' %%'))
ORDER BY f.said_at DESC, f.fact_id LIMIT %(limit)s
""").format(scope=in_scope("f"))
_NON_WORD = re.compile(r"[^\w\s]+")


def padded_words(question: str) -> str:
    """The question lower-cased, punctuation as spaces, one space around each word."""
    return f" {' '.join(_NON_WORD.sub(' ', question.lower()).split())} "


async def nearest_gists(conn: AsyncConnection, *, tenant: str, vector: np.ndarray,
                        conversation_ids: list[str] | None, limit: int) -> list[dict[str, Any]]:
    return await rows(conn, NEAREST_GISTS, {"tenant": tenant, "conversations": conversations(conversation_ids),
                                            "vector": vector, "limit": limit})


async def facts_named(conn: AsyncConnection, *, tenant: str, question: str, conversation_ids: list[str] | None,
                      limit: int) -> list[dict[str, Any]]:
    return await rows(conn, FACTS_NAMED, {"tenant": tenant, "conversations": conversations(conversation_ids),
                                          "padded": padded_words(question), "limit": limit})
