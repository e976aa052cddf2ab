"""What `fast` mode puts before the master in one call: the best gists, the facts
about entities the question names, and the best turns, each a dated, citable line."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from psycopg import AsyncConnection

from epistream.contracts import Evidence

from .retrieval import RetrievedTurn, facts_named, nearest_gists


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
    items: list[ContextItem] = []
    for g in await nearest_gists(conn, tenant=tenant, vector=vector, conversation_ids=conversation_ids, limit=gists):
        items.append(ContextItem(f"gist: {g['text']}", g["said_at"], Evidence(
            conversation_id=g["conversation_id"], segment_id=g["segment_id"], turn_ids=list(g["turn_ids"]),
            quote=g["text"], time=g["said_at"])))
    for f in await facts_named(conn, tenant=tenant, question=question, conversation_ids=conversation_ids,
                               limit=facts):
        quote = f"{f['subject']} {f['predicate']} {f['object']}"
        period = _period(f["point_in_time"], f["start_time"], f["end_time"])
        items.append(ContextItem(f"fact: {quote}, {period} (said {f['said_at']:%Y-%m-%d})", f["said_at"],
                                 Evidence(conversation_id=f["conversation_id"], segment_id=f["segment_id"],
                                          turn_ids=list(f["turn_ids"]), quote=quote, time=f["said_at"])))
    return items
