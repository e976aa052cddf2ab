"""Forgetting: a conversation, or a whole tenant, leaves no row, embedding or
graph element behind, and a tombstone keeps a replay of `memory.turns` from
bringing it back. Writers racing it are held off by the tombstone guard (see
store.tombstones); entities that survive are re-derived from the names the
surviving conversations gave them (see store.entity_names)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg import AsyncConnection

from epistream.contracts.events import MemoryEvent, new_event
from epistream.storage.db import tenant_scope

from . import entity_names, events, graph
from .tombstones import WHOLE_TENANT, exclude_writers

# A forget done again keeps the first tombstone (and its time): the application role may only add them.
ADD_TOMBSTONE = """
INSERT INTO memory.tombstones (tenant, conversation_id) VALUES (%s, %s)
ON CONFLICT (tenant, conversation_id) DO NOTHING
"""
SEGMENTS_IN_SCOPE = """
SELECT segment_id FROM memory.segments WHERE tenant = %(tenant)s
  AND (%(conversation)s::text IS NULL OR conversation_id = %(conversation)s)
"""
# Children before parents; every statement is scoped to the tenant, and to the
# conversation unless the whole tenant goes.
DELETES = [
    ("facts", "DELETE FROM memory.facts WHERE tenant = %(tenant)s"
              " AND (%(conversation)s::text IS NULL OR conversation_id = %(conversation)s)"),
    ("gists", "DELETE FROM memory.gists WHERE tenant = %(tenant)s"
              " AND (%(conversation)s::text IS NULL OR conversation_id = %(conversation)s)"),
    ("segments", "DELETE FROM memory.segments WHERE tenant = %(tenant)s"
                 " AND (%(conversation)s::text IS NULL OR conversation_id = %(conversation)s)"),
    ("segmenter_state", "DELETE FROM memory.segmenter_state WHERE tenant = %(tenant)s"
                        " AND (%(conversation)s::text IS NULL OR conversation_id = %(conversation)s)"),
    ("turns", "DELETE FROM memory.turns WHERE tenant = %(tenant)s"
              " AND (%(conversation)s::text IS NULL OR conversation_id = %(conversation)s)"),
    # Entities nothing refers to any more (mentions went with their gists).
    ("entities", """DELETE FROM memory.entities e WHERE e.tenant = %(tenant)s
                    AND NOT EXISTS (SELECT 1 FROM memory.facts f WHERE f.tenant = e.tenant
                                    AND e.entity_id IN (f.subject_id, f.object_id))
                    AND NOT EXISTS (SELECT 1 FROM memory.gist_mentions m WHERE m.tenant = e.tenant
                                    AND m.entity_id = e.entity_id)"""),
]
REMAINING_ENTITIES = "SELECT entity_id FROM memory.entities WHERE tenant = %s"

DELETE_FACT_EDGES = graph._statement(
    "MATCH ()-[f:FACT {tenant: $tenant}]->() WHERE f.segment_id IN $segment_ids DELETE f RETURN count(*)"
)
DELETE_GIST_EDGES = graph._statement(
    "MATCH (g:Gist {tenant: $tenant})-[r]-() WHERE g.segment_id IN $segment_ids DELETE r RETURN count(*)"
)
DELETE_GISTS = graph._statement(
    "MATCH (g:Gist {tenant: $tenant}) WHERE g.segment_id IN $segment_ids DELETE g RETURN count(*)"
)
DELETE_ORPHAN_ENTITIES = graph._statement(
    "MATCH (e:Entity {tenant: $tenant}) WHERE NOT e.entity_id IN $keep DELETE e RETURN count(*)"
)


@dataclass(frozen=True)
class Forgotten:
    tenant: str
    conversation_id: str | None
    rows: dict[str, int]
    graph_elements: int


async def forget(conn: AsyncConnection, tenant: str, conversation_id: str | None = None) -> Forgotten:
    """Delete a conversation (or, with None, the whole tenant) in one transaction."""
    params = {"tenant": tenant, "conversation": conversation_id}
    rows: dict[str, int] = {}
    async with tenant_scope(conn, tenant):
        # First: wait for writers that passed the guard, keep new ones out; what follows sees their rows.
        await exclude_writers(conn, tenant, conversation_id)
        added = await conn.execute(ADD_TOMBSTONE, (tenant, conversation_id or WHOLE_TENANT))
        if added.rowcount == 1:  # the first forget of this scope is announced; one done again changes nothing
            await events.add(conn, [forgotten_event(tenant, conversation_id, await events.now(conn))])
        cur = await conn.execute(SEGMENTS_IN_SCOPE, params)
        segment_ids = [r[0] for r in await cur.fetchall()]
        renamed = await entity_names.named_in(conn, tenant, segment_ids)
        in_graph = {"tenant": tenant, "segment_ids": segment_ids}
        # Edges before vertices (see store.graph: DETACH DELETE under RLS crashes AGE 1.7).
        removed = 0
        for statement in (DELETE_FACT_EDGES, DELETE_GIST_EDGES, DELETE_GISTS):
            removed += _count(await graph.run(conn, statement, in_graph))
        for table, statement in DELETES:
            cur = await conn.execute(statement, params)
            rows[table] = cur.rowcount
        # Entities the forgotten segments named and others still refer to: only the survivors' names.
        rows["entities_renamed"] = await entity_names.refresh(conn, tenant, renamed)
        cur = await conn.execute(REMAINING_ENTITIES, (tenant,))
        keep = [r[0] for r in await cur.fetchall()]
        removed += _count(await graph.run(conn, DELETE_ORPHAN_ENTITIES, {"tenant": tenant, "keep": keep}))
    return Forgotten(tenant, conversation_id, rows, removed)


def forgotten_event(tenant: str, conversation_id: str | None, at: datetime) -> MemoryEvent:
    """The event of a forget: its outbox row outlives the rows it deleted (the outbox is not in DELETES)."""
    return new_event("conversation_forgotten", tenant, conversation_id, at, identity=(),
                     scope="tenant" if conversation_id is None else "conversation")


def _count(result: list[tuple]) -> int:
    return int(str(result[0][0])) if result else 0
