"""Turn retrieval: lexical (full-text) and dense (pgvector HNSW) pathways fused by
reciprocal rank, computed in PostgreSQL on its indexes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import class_row

# Each pathway takes its own top `pool` on its own index, then ranks are fused.
# The lexical query ORs the question's lexemes (plainto_tsquery ANDs them,
# which finds nothing for most natural questions).
FUSED_TURN_SEARCH = """
WITH dense AS (
    SELECT tenant, conversation_id, turn_id, row_number() OVER () AS rnk
    FROM (SELECT tenant, conversation_id, turn_id
          FROM memory.turns
          WHERE %(use_dense)s AND tenant = %(tenant)s
            AND (%(conversations)s::text[] IS NULL OR conversation_id = ANY(%(conversations)s))
          ORDER BY embedding <=> %(vector)s
          LIMIT %(pool)s) d
), lexical AS (
    SELECT tenant, conversation_id, turn_id, row_number() OVER () AS rnk
    FROM (SELECT t.tenant, t.conversation_id, t.turn_id
          FROM memory.turns t,
               to_tsquery('english', replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | ')) q
          WHERE %(use_lexical)s AND numnode(q) > 0 AND t.tsv @@ q AND t.tenant = %(tenant)s
            AND (%(conversations)s::text[] IS NULL OR t.conversation_id = ANY(%(conversations)s))
          ORDER BY ts_rank_cd(t.tsv, q) DESC
          LIMIT %(pool)s) l
), fused AS (
    SELECT coalesce(d.tenant, l.tenant) AS tenant,
           coalesce(d.conversation_id, l.conversation_id) AS conversation_id,
           coalesce(d.turn_id, l.turn_id) AS turn_id,
           d.rnk AS dense_rank, l.rnk AS lexical_rank,
           coalesce(1.0 / (%(rrf_k)s + d.rnk), 0) + coalesce(1.0 / (%(rrf_k)s + l.rnk), 0) AS score
    FROM dense d FULL JOIN lexical l USING (tenant, conversation_id, turn_id)
)
SELECT f.conversation_id, f.turn_id, t.speaker, t.text, t.ts, t.session_id,
       f.score::float8 AS score, f.dense_rank, f.lexical_rank
FROM fused f JOIN memory.turns t USING (tenant, conversation_id, turn_id)
ORDER BY f.score DESC, t.ts
LIMIT %(top_k)s
"""


@dataclass(frozen=True)
class RetrievedTurn:
    conversation_id: str
    turn_id: str
    speaker: str
    text: str
    ts: datetime
    session_id: str | None
    score: float
    dense_rank: int | None
    lexical_rank: int | None


async def search_turns(
    conn: AsyncConnection,
    *,
    tenant: str,
    query: str,
    vector: np.ndarray,
    conversation_ids: list[str] | None,
    top_k: int,
    pool: int = 50,
    rrf_k: int = 60,
    use_dense: bool = True,
    use_lexical: bool = True,
) -> list[RetrievedTurn]:
    params = {
        "tenant": tenant,
        "query": query,
        "vector": vector,
        "conversations": conversation_ids or None,
        "top_k": top_k,
        "pool": pool,
        "rrf_k": rrf_k,
        "use_dense": use_dense,
        "use_lexical": use_lexical,
    }
    async with conn.cursor(row_factory=class_row(RetrievedTurn)) as cur:
        await cur.execute(FUSED_TURN_SEARCH, params)
        return await cur.fetchall()
