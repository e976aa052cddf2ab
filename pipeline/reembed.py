"""Re-embedding in place: vectors another embedding model made (a switch of EPISTREAM_EMBEDDING_MODEL,
sql/018), and turns embedded from an older text (sql/011). A batch at a time, inside one tenant's
scope, on the indexer's housekeeping timer, so memory moves to the configured model while the stream
goes on and nothing waits for a replay. Until a row is re-embedded, dense reads skip it (they compare
only the connection's model's vectors) and it is found lexically. Rows another writer holds are
skipped (SKIP LOCKED): that writer embeds them with the configured model anyway."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, LiteralString

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from epistream.core.metrics import Metrics
from epistream.models.embeddings import TURN_EMBEDDING_VERSION, Embedder, turn_embedding_text
from epistream.storage.db import tenant_scope

from .store.turns import local_time

#: Rows per batch: one embedding batch (a fraction of a second on one core), small beside ingest.
BATCH = 64
PENDING = "SELECT kind, tenant, rows FROM memory.vectors_to_reembed(%s, %s) ORDER BY kind, tenant"


@dataclass(frozen=True)
class EmbeddedColumn:
    """One table's vector: which rows are stale, what their key is, and the text it embeds."""

    kind: str  # as memory.vectors_to_reembed names it
    key: tuple[str, ...]
    text: tuple[str, ...]
    column: str = "embedding"
    stale: LiteralString = "(embedded_by < %(model)s OR embedded_by > %(model)s)"
    embed_text: Callable[..., str] = str
    also_set: LiteralString = ""


KINDS = {c.kind: c for c in (
    EmbeddedColumn("turns", ("conversation_id", "turn_id"), ("speaker", "text", "ts", "tz_offset_s"),
                   stale="(embedded_by < %(model)s OR embedded_by > %(model)s OR embedded_as < %(version)s)",
                   embed_text=lambda speaker, text, ts, offset: turn_embedding_text(speaker, text, local_time(ts, offset)),
                   also_set=", embedded_as = %(version)s"),
    EmbeddedColumn("gists", ("gist_id",), ("text",)),
    EmbeddedColumn("segments", ("segment_id",), ("summary",), column="summary_embedding",
                   stale="(embedded_by < %(model)s OR embedded_by > %(model)s) AND summary_embedding IS NOT NULL"),
    EmbeddedColumn("entities", ("entity_id",), ("name",)),
    EmbeddedColumn("entity_names", ("entity_id", "segment_id", "surface"), ("surface",),
                   stale="(embedded_by < %(model)s OR embedded_by > %(model)s) AND embedding IS NOT NULL"),
)}


def _select(kind: EmbeddedColumn) -> sql.Composed:
    return sql.SQL("SELECT {key}, {text} FROM {table} WHERE tenant = %(tenant)s AND {stale}"
                   " LIMIT %(limit)s FOR UPDATE SKIP LOCKED").format(
        key=sql.SQL(", ").join(map(sql.Identifier, kind.key)), text=sql.SQL(", ").join(map(sql.Identifier, kind.text)),
        table=sql.Identifier("memory", kind.kind), stale=sql.SQL(kind.stale))


def _update(kind: EmbeddedColumn) -> sql.Composed:
    where = sql.SQL(" AND ").join(sql.SQL("{} = %({})s").format(sql.Identifier(k), sql.SQL(k)) for k in kind.key)
    return sql.SQL("UPDATE {table} SET {column} = %(vector)s, embedded_by = %(model)s{also} "
                   "WHERE tenant = %(tenant)s AND {where}").format(
        table=sql.Identifier("memory", kind.kind), column=sql.Identifier(kind.column),
        also=sql.SQL(kind.also_set), where=where)


async def pending(pool: AsyncConnectionPool, model: str) -> dict[tuple[str, str], int]:
    """Rows still to re-embed, by (kind, tenant)."""
    async with pool.connection() as conn:
        cur = await conn.execute(PENDING, (model, TURN_EMBEDDING_VERSION))
        return {(kind, tenant): rows for kind, tenant, rows in await cur.fetchall()}


async def _reembed(pool: AsyncConnectionPool, embedder: Embedder, kind: EmbeddedColumn, tenant: str,
                   limit: int) -> int:
    params: dict[str, Any] = {"tenant": tenant, "model": embedder.name, "version": TURN_EMBEDDING_VERSION,
                              "limit": limit}
    async with pool.connection() as conn, tenant_scope(conn, tenant):
        cur = await conn.execute(_select(kind), params)
        locked = await cur.fetchall()
        if not locked:
            return 0
        width = len(kind.key)
        texts = [kind.embed_text(*row[width:]) for row in locked]
        vectors = await asyncio.to_thread(embedder.embed, texts)
        async with conn.cursor() as update:
            await update.executemany(_update(kind), [
                {**params, **dict(zip(kind.key, row[:width], strict=True)), "vector": vector}
                for row, vector in zip(locked, vectors, strict=True)])
    return len(locked)


async def reembed_round(pool: AsyncConnectionPool, embedder: Embedder, *, limit: int = BATCH,
                        budget_s: float = 0.0, metrics: Metrics | None = None) -> int:
    """Re-embed stale rows, a batch at a time, until none is left or `budget_s` of wall time is spent
    (0: one batch); returns how many were updated (0: memory is all the configured model's). What is
    left is counted once per round (it is a scan), not once per batch."""
    started, updated = time.monotonic(), 0
    left = await pending(pool, embedder.name)
    if metrics is not None:  # what this round found; the next round counts again
        for kind in KINDS:
            metrics.reembed_pending.labels(kind).set(sum(n for (k, _), n in left.items() if k == kind))
    for (kind, tenant), rows in left.items():
        while rows > 0:
            done = await _reembed(pool, embedder, KINDS[kind], tenant, limit)
            if not done:  # the rest is held by a writer, or was rewritten meanwhile
                break
            rows, updated = rows - done, updated + done
            if metrics is not None:
                metrics.reembedded.labels(kind).inc(done)
            if time.monotonic() - started >= budget_s:
                break
        if updated and time.monotonic() - started >= budget_s:
            break
    return updated
