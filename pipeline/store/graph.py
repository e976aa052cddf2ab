"""The AGE mirror of gists, entities and facts, written inside the caller's transaction.

Every statement is constant Cypher text; values travel in AGE's parameter map
(an agtype bound as a query parameter), and labels are fixed, never built
from model or user text.
"""

from __future__ import annotations

import json
from typing import Any, LiteralString

from psycopg import AsyncConnection

from epistream.storage.db import GRAPH_NAME


def _statement(cypher: LiteralString, returns: LiteralString = "r agtype") -> LiteralString:
    # The graph name is a constant of this project; the Cypher text is a constant of this module.
    return "SELECT * FROM ag_catalog.cypher('" + GRAPH_NAME + "', $$ " + cypher + " $$, %s::agtype) AS (" + returns + ")"  # noqa: S608


# Edges first, then the vertices: AGE 1.7's DETACH DELETE of a vertex with edges
# crashes the backend at commit when row-level security applies to the labels.
DELETE_SEGMENT_GIST_EDGES = _statement(
    "MATCH (g:Gist {tenant: $tenant, segment_id: $segment_id})-[r]-() DELETE r RETURN count(*)"
)
DELETE_SEGMENT_GISTS = _statement(
    "MATCH (g:Gist {tenant: $tenant, segment_id: $segment_id}) DELETE g RETURN count(*)"
)
DELETE_SEGMENT_FACTS = _statement(
    "MATCH ()-[f:FACT {tenant: $tenant, segment_id: $segment_id}]->() DELETE f RETURN count(*)"
)
MERGE_ENTITY = _statement(
    "MERGE (e:Entity {tenant: $tenant, entity_id: $entity_id}) SET e.name = $name RETURN id(e)"
)
CREATE_GIST = _statement(
    "CREATE (g:Gist {tenant: $tenant, gist_id: $gist_id, segment_id: $segment_id,"
    " conversation_id: $conversation_id, text: $text, event_date: $event_date, said_at: $said_at}) RETURN id(g)"
)
CREATE_MENTION = _statement(
    "MATCH (g:Gist {tenant: $tenant, gist_id: $gist_id}), (e:Entity {tenant: $tenant, entity_id: $entity_id})"
    " CREATE (g)-[m:MENTIONS {tenant: $tenant, segment_id: $segment_id}]->(e) RETURN id(m)"
)
CREATE_FACT = _statement(
    "MATCH (s:Entity {tenant: $tenant, entity_id: $subject_id}), (o:Entity {tenant: $tenant, entity_id: $object_id})"
    " CREATE (s)-[f:FACT {tenant: $tenant, fact_id: $fact_id, segment_id: $segment_id, predicate: $predicate,"
    " point_in_time: $point_in_time, start_time: $start_time, end_time: $end_time, said_at: $said_at}]->(o)"
    " RETURN id(f)"
)
CREATE_SIMILAR = _statement(
    "MATCH (a:Gist {tenant: $tenant, gist_id: $gist_id}), (b:Gist {tenant: $tenant, gist_id: $other_id})"
    " CREATE (a)-[s:SIMILAR {tenant: $tenant, similarity: $similarity, segment_id: $segment_id}]->(b) RETURN id(s)"
)


async def run(conn: AsyncConnection, statement: LiteralString, params: dict[str, Any]) -> list[tuple]:
    cur = await conn.execute(statement, (json.dumps(params, default=str),))
    return await cur.fetchall()


async def delete_segment(conn: AsyncConnection, tenant: str, segment_id: str) -> None:
    keys = {"tenant": tenant, "segment_id": segment_id}
    await run(conn, DELETE_SEGMENT_FACTS, keys)
    await run(conn, DELETE_SEGMENT_GIST_EDGES, keys)
    await run(conn, DELETE_SEGMENT_GISTS, keys)
