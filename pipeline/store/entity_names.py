"""Which segment gave an entity which name (memory.entity_names, sql/010).

Enrichment records every name it resolves to an entity; the entity row (name,
normalized name, embedding, first seen, aliases) is what those records say,
the earliest surviving one first. Forgetting a conversation removes its
segments' records (a cascade) and `refresh` re-derives the entities they
touched, so a surviving entity keeps only the names survivors gave it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from psycopg import AsyncConnection

from epistream.contracts.segments import Segment

from . import graph

RECORD = """
INSERT INTO memory.entity_names (tenant, entity_id, segment_id, surface, normalized_name, embedding, seen_at)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (tenant, entity_id, segment_id, surface) DO NOTHING
"""
FORGET_SEGMENT = "DELETE FROM memory.entity_names WHERE tenant = %s AND segment_id = %s"
NAMED_IN = "SELECT DISTINCT entity_id FROM memory.entity_names WHERE tenant = %s AND segment_id = ANY(%s)"
# The earliest surviving name (one recorded with its embedding first) becomes the entity's name, with
# its normalised form and embedding; a name recorded before sql/010 has neither, and the entity keeps
# its own. The normalised form also stays when another entity holds it (the unique index), which only
# a race of two first sightings makes.
RENAME = """
WITH first_name AS (
    SELECT DISTINCT ON (n.entity_id) n.entity_id, n.surface, n.normalized_name, n.embedding, n.embedded_by
    FROM memory.entity_names n
    WHERE n.tenant = %(tenant)s AND n.entity_id = ANY(%(ids)s)
    ORDER BY n.entity_id, n.embedding IS NULL, n.seq
), seen AS (
    SELECT entity_id, min(seen_at) AS first_seen FROM memory.entity_names
    WHERE tenant = %(tenant)s AND entity_id = ANY(%(ids)s) GROUP BY entity_id
)
UPDATE memory.entities e
SET name = f.surface, embedding = coalesce(f.embedding, e.embedding), first_seen = s.first_seen,
    embedded_by = CASE WHEN f.embedding IS NULL THEN e.embedded_by ELSE f.embedded_by END,
    normalized_name = CASE WHEN f.normalized_name IS NULL OR EXISTS (
        SELECT 1 FROM memory.entities o WHERE o.tenant = e.tenant AND o.normalized_name = f.normalized_name
        AND o.entity_id <> e.entity_id) THEN e.normalized_name ELSE f.normalized_name END
FROM first_name f JOIN seen s USING (entity_id)
WHERE e.tenant = %(tenant)s AND e.entity_id = f.entity_id
RETURNING e.entity_id, e.name
"""
# Aliases: the other surviving names, in the order they were given (what ADD_ALIAS appended).
REALIAS = """
UPDATE memory.entities e
SET aliases = coalesce((
    SELECT array_agg(a.surface ORDER BY a.first) FROM (
        SELECT n.surface, min(n.seq) AS first FROM memory.entity_names n
        WHERE n.tenant = e.tenant AND n.entity_id = e.entity_id AND n.surface <> e.name
          AND n.normalized_name IS DISTINCT FROM e.normalized_name
        GROUP BY n.surface) a), '{}')
WHERE e.tenant = %(tenant)s AND e.entity_id = ANY(%(ids)s)
  AND EXISTS (SELECT 1 FROM memory.entity_names n WHERE n.tenant = e.tenant AND n.entity_id = e.entity_id)
"""
SET_GRAPH_NAME = graph._statement(
    "MATCH (e:Entity {tenant: $tenant, entity_id: $entity_id}) SET e.name = $name RETURN id(e)"
)


async def record(conn: AsyncConnection, segment: Segment, ident: str, normalized: str, surface: str,
                 vector: np.ndarray) -> None:
    await conn.execute(RECORD, (segment.tenant, ident, segment.segment_id, surface, normalized, vector,
                                segment.turns[0].ts))


async def forget_segment(conn: AsyncConnection, tenant: str, segment_id: str) -> None:
    """Before a segment is enriched again: its new names replace the old."""
    await conn.execute(FORGET_SEGMENT, (tenant, segment_id))


async def named_in(conn: AsyncConnection, tenant: str, segment_ids: Sequence[str]) -> list[str]:
    """The entities these segments named: call before deleting the segments, refresh after."""
    cur = await conn.execute(NAMED_IN, (tenant, list(segment_ids)))
    return [row[0] for row in await cur.fetchall()]


async def refresh(conn: AsyncConnection, tenant: str, entity_ids: Sequence[str]) -> int:
    """Re-derive these entities (those still there) from their surviving names, graph included."""
    if not entity_ids:
        return 0
    params = {"tenant": tenant, "ids": list(entity_ids)}
    cur = await conn.execute(RENAME, params)
    renamed = await cur.fetchall()
    await conn.execute(REALIAS, params)
    for ident, name in renamed:
        await graph.run(conn, SET_GRAPH_NAME, {"tenant": tenant, "entity_id": ident, "name": name})
    return len(renamed)
