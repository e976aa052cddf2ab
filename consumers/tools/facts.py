"""``find_entity_contexts``: temporal facts by subject / predicate / object and
time range, ordered, paged and aggregated (count, first, last)."""

from __future__ import annotations

from datetime import date
from typing import Any

from psycopg import AsyncConnection, sql

from epistream.core.names import normalize_name, normalize_predicate

from ..retrieval.execute import rows
from ..retrieval.fragments import conversations, fact_days, in_conversations, overlaps_window
from .limits import ENTITY_MATCH_LIMIT, Aggregate, Order
from .results import EntityContexts, FactRow

_ALIAS_MATCHES = sql.SQL(
    "EXISTS (SELECT 1 FROM unnest(e.aliases) a WHERE lower(btrim(a)) IN (%(lowered)s, %(normalized)s))")

# Candidate entities for a name, best tier first: 1 the normalised name,
# 2 an alias (surface forms, compared case-insensitively), 3 a normalised name
# containing the text. The caller keeps only the best tier found.
MATCH_ENTITIES = sql.SQL("""
SELECT m.entity_id, m.name, m.tier
FROM (
    SELECT e.entity_id, e.name, e.normalized_name,
           CASE WHEN e.normalized_name = %(normalized)s THEN 1
                WHEN {alias_matches} THEN 2
                ELSE 3 END AS tier
    FROM memory.entities e
    WHERE e.tenant = %(tenant)s
      AND (e.normalized_name = %(normalized)s OR {alias_matches} OR e.normalized_name ILIKE %(pattern)s ESCAPE '\\')
) m
ORDER BY m.tier, length(m.normalized_name), m.name, m.entity_id
LIMIT %(limit)s
""").format(alias_matches=_ALIAS_MATCHES)

# Predicates containing the text, best tier first: 1 equal, 2 prefix, 3 contains.
MATCH_PREDICATES = sql.SQL("""
SELECT p.predicate, p.tier
FROM (
    SELECT DISTINCT f.predicate,
           CASE WHEN f.predicate = %(predicate)s THEN 1
                WHEN starts_with(f.predicate, %(predicate)s) THEN 2
                ELSE 3 END AS tier
    FROM memory.facts f
    WHERE f.tenant = %(tenant)s AND strpos(f.predicate, %(predicate)s) > 0 AND {conversations}
) p
ORDER BY p.tier, p.predicate
""").format(conversations=in_conversations("f"))

# The facts matching the filters, one per statement: the same triple with the
# same qualifiers said at the same instant (a turn carried into two overlapping
# segments yields it twice) counts once.
# A fact's interval: [point_in_time] for an event; [start_time, end_time] for a
# period, open-ended where a bound is missing; [said_at's day] when undated.
# It matches [start, end] when the two overlap. Its time for ordering is
# coalesce(point_in_time, start_time, said_at::date), then said_at, then fact_id.
# One round trip: the count of matching facts, with the requested page (a row of
# NULLs beside the count when the page is empty).
FACTS = sql.SQL("""
WITH source AS (
    SELECT f.* FROM memory.facts f WHERE f.tenant = %(tenant)s AND NOT %(current_only)s
    UNION ALL
    SELECT c.* FROM memory.current_facts c WHERE c.tenant = %(tenant)s AND %(current_only)s
), matching AS (
    SELECT DISTINCT ON (s.conversation_id, s.subject_id, s.predicate, s.object_id,
                        s.point_in_time, s.start_time, s.end_time, s.said_at)
           s.*, coalesce(s.point_in_time, s.start_time, s.said_at::date) AS fact_time
    FROM source s
    WHERE {conversations}
      AND (%(subject_ids)s::text[] IS NULL OR s.subject_id = ANY(%(subject_ids)s))
      AND (%(object_ids)s::text[] IS NULL OR s.object_id = ANY(%(object_ids)s))
      AND (%(predicates)s::text[] IS NULL OR s.predicate = ANY(%(predicates)s))
      AND {in_window}
    ORDER BY s.conversation_id, s.subject_id, s.predicate, s.object_id,
             s.point_in_time, s.start_time, s.end_time, s.said_at, s.fact_id
), counted AS (
    SELECT count(*) AS total FROM matching
)
SELECT c.total, p.*
FROM counted c
LEFT JOIN LATERAL (
    SELECT m.fact_id, m.conversation_id, m.segment_id, sub.name AS subject, m.predicate, obj.name AS object,
           m.point_in_time, m.start_time, m.end_time, m.said_at, m.turn_ids
    FROM matching m
    JOIN memory.entities sub ON sub.tenant = m.tenant AND sub.entity_id = m.subject_id
    JOIN memory.entities obj ON obj.tenant = m.tenant AND obj.entity_id = m.object_id
    ORDER BY CASE WHEN %(ascending)s THEN m.fact_time END ASC,
             CASE WHEN %(ascending)s THEN m.said_at END ASC,
             CASE WHEN %(ascending)s THEN m.fact_id END ASC,
             m.fact_time DESC, m.said_at DESC, m.fact_id DESC
    LIMIT %(limit)s OFFSET %(offset)s
) p ON true
""").format(conversations=in_conversations("s"), in_window=overlaps_window(*fact_days("s"), "day"))


def _like_contains(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def _match_entities(conn: AsyncConnection, tenant: str, text: str) -> list[dict[str, Any]]:
    normalized = normalize_name(text)
    if not normalized:
        return []
    found = await rows(conn, MATCH_ENTITIES, {
        "tenant": tenant, "normalized": normalized, "lowered": " ".join(text.lower().split()),
        "pattern": _like_contains(normalized), "limit": ENTITY_MATCH_LIMIT,
    })
    best = min((r["tier"] for r in found), default=None)
    return [r for r in found if r["tier"] == best]


async def _match_predicates(conn: AsyncConnection, tenant: str, text: str,
                            scope: list[str] | None) -> list[str]:
    predicate = normalize_predicate(text)
    if not predicate:
        return []
    found = await rows(conn, MATCH_PREDICATES, {"tenant": tenant, "predicate": predicate, "conversations": scope})
    best = min((r["tier"] for r in found), default=None)
    return [r["predicate"] for r in found if r["tier"] == best]


def _names(found: list[dict[str, Any]] | None) -> list[str]:
    return [r["name"] for r in found or []]


async def find_entity_contexts(
    conn: AsyncConnection,
    *,
    tenant: str,
    subject: str | None = None,
    predicate: str | None = None,
    object: str | None = None,  # the tool's argument name, shadowing the builtin here only
    start: date | None = None,
    end: date | None = None,
    order: Order = "asc",
    limit: int = 10,
    offset: int = 0,
    aggregate: Aggregate = "none",
    current_only: bool = False,
    conversation_ids: list[str] | None = None,
) -> EntityContexts:
    """Temporal facts filtered by entity names, predicate and time range; ordered, paged, aggregated.

    Names match by normalised name, else by alias, else by containment in a normalised
    name (the best tier found wins). Predicates match exactly, else by prefix, else by
    containment ('lives' -> 'lives_in'). ``first``/``last`` return the earliest/latest
    fact (``offset`` still applies: last with offset 1 is the one before the latest);
    ``count`` returns the number of matching facts plus the first page.
    """
    if aggregate not in ("none", "count", "first", "last"):
        raise ValueError(f"aggregate must be none, count, first or last, not {aggregate!r}")
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
    scope = conversations(conversation_ids)
    subjects = await _match_entities(conn, tenant, subject) if subject is not None else None
    objects = await _match_entities(conn, tenant, object) if object is not None else None
    predicates = await _match_predicates(conn, tenant, predicate, scope) if predicate is not None else None
    if subjects == [] or objects == [] or predicates == []:  # a filter that matches nothing
        return EntityContexts(facts=[], total=0, aggregate=aggregate, count=0 if aggregate == "count" else None,
                              subjects=_names(subjects), objects=_names(objects), predicates=predicates or [])
    ascending = order == "asc"
    if aggregate in ("first", "last"):
        ascending, limit = aggregate == "first", 1
    params = {
        "tenant": tenant, "current_only": current_only, "conversations": scope,
        "subject_ids": [r["entity_id"] for r in subjects] if subjects is not None else None,
        "object_ids": [r["entity_id"] for r in objects] if objects is not None else None,
        "predicates": predicates, "start": start, "end": end,
        "ascending": ascending, "limit": limit, "offset": offset,
    }
    found = await rows(conn, FACTS, params)
    total = int(found[0]["total"]) if found else 0
    facts = [FactRow(**{k: v for k, v in r.items() if k != "total"}) for r in found if r["fact_id"] is not None]
    return EntityContexts(facts=facts, total=total, aggregate=aggregate,
                          count=total if aggregate == "count" else None,
                          subjects=_names(subjects), objects=_names(objects), predicates=predicates or [])
