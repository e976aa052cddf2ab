"""Re-embedding of turns stored before their embedding text changed (sql/011): a few at a time, on the
indexer's housekeeping timer, so existing memory improves while the stream goes on and nothing waits
for a replay. A turn rewritten meanwhile is embedded by its own write; locked ones are skipped."""

from __future__ import annotations

import asyncio
import itertools

from psycopg_pool import AsyncConnectionPool

from epistream.db import tenant_scope
from epistream.embeddings import Embedder, turn_embedding_text

from .store import turns

#: Turns per round: one embedding batch (a fraction of a second on one core), small beside ingest.
BATCH = 64


async def reembed_round(pool: AsyncConnectionPool, embedder: Embedder, *, limit: int = BATCH) -> int:
    """Re-embed up to `limit` turns with an older embedding; returns how many were updated (0: done)."""
    async with pool.connection() as conn:
        stale = await turns.stale_embeddings(conn, limit)
    updated = 0
    for (tenant, conversation_id), rows in itertools.groupby(stale, key=lambda r: (r[0], r[1])):
        async with pool.connection() as conn, tenant_scope(conn, tenant):
            locked = await turns.lock_stale(conn, tenant, conversation_id, [r[2] for r in rows])
            if not locked:
                continue
            texts = [turn_embedding_text(speaker, text, ts) for _, speaker, text, ts in locked]
            vectors = await asyncio.to_thread(embedder.embed, texts)
            for (turn_id, *_), vector in zip(locked, vectors, strict=True):
                await turns.set_embedding(conn, tenant, conversation_id, turn_id, vector)
            updated += len(locked)
    return updated
