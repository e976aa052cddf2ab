"""What `fast` mode puts before the master in one call: the best gists, the facts
about entities the question names, and the best turns, each a dated, citable line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from psycopg import AsyncConnection

from epistream.contracts import Evidence

from .retrieve import RetrievedTurn

NEAREST_GISTS = """
SELECT gist_id, conversation_id, segment_id, text, turn_ids, said_at FROM memory.gists
WHERE tenant = %(tenant)s AND (%(conversations)s::text[] IS NULL OR conversation_id = ANY(%(conversations)s))
ORDER BY embedding <=> %(vector)s LIMIT %(limit)s
"""
# Facts whose subject or object the question names (whole words of the normalised question).
FACTS_NAMED = """
SELECT f.fact_id, f.conversation_id, f.segment_id, s.name, f.predicate, o.name,
       f.point_in_time, f.start_time, f.end_time, f.turn_ids, f.said_at
FROM memory.facts f
JOIN memory.entities s ON s.tenant = f.tenant AND s.entity_id = f.subject_id
JOIN memory.entities o ON o.tenant = f.tenant AND o.entity_id = f.object_id
WHERE f.tenant = %(tenant)s AND (%(conversations)s::text[] IS NULL OR f.conversation_id = ANY(%(conversations)s))
  AND ((length(s.normalized_name) > 2 AND %(padded)s LIKE '%% ' || s.normalized_name || ' %%')
    OR (length(o.normalized_name) > 2 AND %(padded)s LIKE '%% ' || o.normalized_name || ' %%'))
ORDER BY f.said_at DESC, f.fact_id LIMIT %(limit)s
"""
_NON_WORD = re.compile(r"[^\w\s]+")


@dataclass(frozen=True)
class ContextItem:
    line: str
    time: datetime
    evidence: Evidence


def turn_item(turn: RetrievedTurn) -> ContextItem:
    return ContextItem(
        line=f"{turn.ts:%Y-%m-%d %H:%M (%A)} {turn.speaker}: {turn.text}", time=turn.ts,
        evidence=Evidence(conversation_id=turn.conversation_id, turn_ids=[turn.turn_id], quote=turn.text,
                          time=turn.ts, speaker=turn.speaker),
    )


def _period(point, start, end) -> str:  # type: ignore[no-untyped-def]
    if point:
        return f"on {point}"
    if start or end:
        return f"from {start or '?'} to {end or 'now'}"
    return "time not stated"


async def gist_and_fact_items(
    conn: AsyncConnection, *, tenant: str, question: str, vector: np.ndarray, conversation_ids: list[str] | None,
    gists: int = 5, facts: int = 10,
) -> list[ContextItem]:
    params = {"tenant": tenant, "conversations": conversation_ids or None, "vector": vector}
    items: list[ContextItem] = []
    cur = await conn.execute(NEAREST_GISTS, params | {"limit": gists})
    for _, conversation_id, segment_id, text, turn_ids, said_at in await cur.fetchall():
        items.append(ContextItem(f"gist: {text}", said_at, Evidence(
            conversation_id=conversation_id, segment_id=segment_id, turn_ids=list(turn_ids), quote=text,
            time=said_at)))
    padded = f" {' '.join(_NON_WORD.sub(' ', question.lower()).split())} "
    cur = await conn.execute(FACTS_NAMED, params | {"padded": padded, "limit": facts})
    for _, conversation_id, segment_id, subject, predicate, obj, point, start, end, turn_ids, said_at in \
            await cur.fetchall():
        quote = f"{subject} {predicate} {obj}"
        items.append(ContextItem(f"fact: {quote}, {_period(point, start, end)} (said {said_at:%Y-%m-%d})", said_at,
                                 Evidence(conversation_id=conversation_id, segment_id=segment_id,
                                          turn_ids=list(turn_ids), quote=quote, time=said_at)))
    return items
