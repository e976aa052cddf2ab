"""``find_gist_contexts``: a gist's source turns, its neighbours in time, the
entities it mentions and its near-paraphrases (the synonym edges of the hybrid
graph, on the relational side: cosine above the similar threshold of the embedding model, EPISTREAM_SIMILAR_THRESHOLD)."""

from __future__ import annotations

from psycopg import AsyncConnection, sql

from epistream.storage.db import CONNECTION_EMBEDDER, CONNECTION_SIMILAR_CUTOFF

from ..retrieval import load_turns
from ..retrieval.execute import rows
from ..retrieval.fragments import GIST_COLUMNS, GIST_FIELDS, conversations, in_scope, nearest_in_order, of_tenant
from .limits import SIMILAR_LIMIT
from .results import EntityRef, GistContexts, GistHit, TurnHit

GIST_BY_ID = sql.SQL("""
SELECT {gist_columns},
       -- Compared only with vectors of the same model (sql/018): none while the gist awaits re-embedding.
       CASE WHEN g.embedded_by = {model} THEN g.embedding END AS embedding
FROM memory.gists g
WHERE {scope} AND g.gist_id = %(gist_id)s
""").format(gist_columns=GIST_COLUMNS, scope=in_scope("g"), model=CONNECTION_EMBEDDER)

def _neighbours(comparison: sql.SQL, direction: sql.SQL) -> sql.Composed:
    """The conversation's gists on one side of the gist, in (event_date, said_at, gist_id) order."""
    return sql.SQL("""
SELECT {gist_columns}
FROM memory.gists g
WHERE {tenant} AND g.conversation_id = %(conversation_id)s
  AND (g.event_date, g.said_at, g.gist_id) {comparison} (%(event_date)s::date, %(said_at)s::timestamptz,
                                                        %(gist_id)s::text)
ORDER BY g.event_date {direction}, g.said_at {direction}, g.gist_id {direction}
LIMIT %(window)s
""").format(gist_columns=GIST_COLUMNS, tenant=of_tenant("g"), comparison=comparison, direction=direction)


GISTS_BEFORE = _neighbours(sql.SQL("<"), sql.SQL("DESC"))  # nearest first; reversed to oldest first
GISTS_AFTER = _neighbours(sql.SQL(">"), sql.SQL("ASC"))

GIST_ENTITIES = sql.SQL("""
SELECT e.entity_id, e.name, e.aliases
FROM memory.gist_mentions m
JOIN memory.entities e ON e.tenant = m.tenant AND e.entity_id = m.entity_id
WHERE m.tenant = %(tenant)s AND m.gist_id = %(gist_id)s
ORDER BY e.name, e.entity_id
""")

SIMILAR_GISTS = nearest_in_order(
    "gists", "g", GIST_FIELDS,
    sql.SQL("{scope} AND g.gist_id <> %(gist_id)s").format(scope=in_scope("g")),
    tiebreak=("gist_id",), keep=sql.SQL("n.distance < 1 - {}").format(CONNECTION_SIMILAR_CUTOFF))


async def find_gist_contexts(
    conn: AsyncConnection,
    *,
    tenant: str,
    gist_id: str,
    window: int = 2,
    conversation_ids: list[str] | None = None,
) -> GistContexts | None:
    """The gist with its source turns, time neighbours, mentioned entities and similar gists; None if unknown.

    With ``conversation_ids``, the gist and its similar gists must lie in those conversations.
    """
    scope = conversations(conversation_ids)
    found = await rows(conn, GIST_BY_ID, {"tenant": tenant, "gist_id": gist_id, "conversations": scope})
    if not found:
        return None
    row = found[0]
    gist = GistHit.from_row(row)
    around = {"tenant": tenant, "conversation_id": gist.conversation_id, "event_date": gist.event_date,
              "said_at": gist.said_at, "gist_id": gist.gist_id, "window": window}
    turns = await load_turns(conn, tenant=tenant, conversation_id=gist.conversation_id, turn_ids=gist.turn_ids)
    before = await rows(conn, GISTS_BEFORE, around) if window > 0 else []
    after = await rows(conn, GISTS_AFTER, around) if window > 0 else []
    entities = await rows(conn, GIST_ENTITIES, {"tenant": tenant, "gist_id": gist.gist_id})
    similar = [] if row["embedding"] is None else await rows(conn, SIMILAR_GISTS, {
        "tenant": tenant, "gist_id": gist.gist_id, "vector": row["embedding"], "conversations": scope,
        "limit": SIMILAR_LIMIT,
    })
    return GistContexts(
        gist=gist,
        source_turns=[TurnHit.of(t) for t in turns],
        before=[GistHit.from_row(r) for r in reversed(before)],
        after=[GistHit.from_row(r) for r in after],
        entities=[EntityRef(entity_id=r["entity_id"], name=r["name"], aliases=list(r["aliases"])) for r in entities],
        similar=[GistHit.from_row(r) for r in similar],
    )
