"""Writes one segment's enrichment: summary, entities, gists, mentions, facts,
and their AGE mirror, in one transaction. Re-enriching a segment replaces what
that segment produced before, so a replay yields the same rows, never more."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Literal

import numpy as np
from psycopg import AsyncConnection, sql

from epistream.contracts.events import MemoryEvent, new_event
from epistream.contracts.segments import Segment
from epistream.core.names import entity_id, normalize_name
from epistream.models.llm import storable
from epistream.settings.processes import Settings
from epistream.storage.db import CONNECTION_EMBEDDER, tenant_scope

from ..enrichment import Enrichment
from . import entity_names, events, graph
from .tombstones import guard, is_forgotten

LOCK_SEGMENT = "SELECT 1 FROM memory.segments WHERE tenant = %s AND segment_id = %s FOR UPDATE"
DELETE_FACTS = "DELETE FROM memory.facts WHERE tenant = %s AND segment_id = %s"
DELETE_GISTS = "DELETE FROM memory.gists WHERE tenant = %s AND segment_id = %s"
ENTITY_BY_NAME = "SELECT entity_id FROM memory.entities WHERE tenant = %s AND normalized_name = %s"
NEAREST_ENTITY = sql.SQL("""
SELECT entity_id, 1 - (embedding <=> %s) AS similarity FROM memory.entities
WHERE tenant = %s AND embedded_by = {model} ORDER BY embedding <=> %s LIMIT 1
""").format(model=CONNECTION_EMBEDDER)
ADD_ALIAS = """
UPDATE memory.entities SET aliases = array_append(aliases, %s)
WHERE tenant = %s AND entity_id = %s AND NOT (%s = ANY(aliases))
"""
INSERT_ENTITY = """
INSERT INTO memory.entities (tenant, entity_id, name, normalized_name, embedding, first_seen)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING
"""
# After a forget re-derived an entity from a surviving name, its id (minted from the forgotten
# name) stays: a new first sighting of that name lands on the entity the id was minted for.
ENTITY_BY_NAME_OR_ID = """
SELECT entity_id FROM memory.entities WHERE tenant = %s AND (normalized_name = %s OR entity_id = %s)
ORDER BY normalized_name = %s DESC LIMIT 1
"""
INSERT_GIST = """
INSERT INTO memory.gists (tenant, gist_id, conversation_id, segment_id, ordinal, text, event_date, date_precision,
                          turn_ids, said_at, embedding)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
SIMILAR_GISTS = sql.SQL("""
SELECT gist_id, 1 - (embedding <=> %s) AS similarity FROM memory.gists
WHERE tenant = %s AND gist_id <> %s AND embedded_by = {model}
ORDER BY embedding <=> %s LIMIT %s
""").format(model=CONNECTION_EMBEDDER)
INSERT_MENTION = "INSERT INTO memory.gist_mentions (tenant, gist_id, entity_id) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
INSERT_FACT = """
INSERT INTO memory.facts (tenant, fact_id, conversation_id, segment_id, ordinal, subject_id, predicate, object_id,
                          point_in_time, start_time, end_time, turn_ids, said_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
MARK_ENRICHED = """
UPDATE memory.segments SET summary = %s, summary_embedding = %s, embedded_by = DEFAULT, status = 'enriched',
       enriched_at = now(), attempts = attempts + 1, error = NULL, prompt_version = %s
WHERE tenant = %s AND segment_id = %s
"""
MARK_FAILED = """
UPDATE memory.segments SET status = 'failed', attempts = attempts + 1, error = %s
WHERE tenant = %s AND segment_id = %s AND status <> 'enriched'
"""
MARK_WAITING = """
UPDATE memory.segments SET status = 'waiting', attempts = attempts + %s, error = %s
WHERE tenant = %s AND segment_id = %s AND status <> 'enriched'
"""
WAITING = "SELECT tenant, segment_id FROM memory.waiting_segments(%s)"
SEGMENT_STATUS = "SELECT status, prompt_version FROM memory.segments WHERE tenant = %s AND segment_id = %s"
STORED_TURNS = """
SELECT turn_id, speaker, text, ts FROM memory.turns WHERE tenant = %s AND conversation_id = %s AND turn_id = ANY(%s)
"""
SIMILAR_CANDIDATES = 10


@dataclass(frozen=True)
class StoreCounts:
    gists: int
    facts: int
    entities: int
    mentions: int
    similar_edges: int


async def _entity(conn: AsyncConnection, segment: Segment, normalized: str, surface: str, vector: np.ndarray,
                  merge_threshold: float) -> str:
    """The entity for a name: the same normalised name, else a near-identical
    name (kept as an alias), else a new entity."""
    tenant = segment.tenant
    cur = await conn.execute(ENTITY_BY_NAME, (tenant, normalized))
    row = await cur.fetchone()
    if row is None:
        cur = await conn.execute(NEAREST_ENTITY, (vector, tenant, vector))
        nearest = await cur.fetchone()
        if nearest is not None and nearest[1] >= merge_threshold:
            await conn.execute(ADD_ALIAS, (surface, tenant, nearest[0], surface))
            await entity_names.record(conn, segment, str(nearest[0]), normalized, surface, vector)
            return str(nearest[0])
        new_id = entity_id(tenant, normalized)
        await conn.execute(INSERT_ENTITY, (tenant, new_id, surface, normalized, vector, segment.turns[0].ts))
        cur = await conn.execute(ENTITY_BY_NAME_OR_ID, (tenant, normalized, new_id, normalized))
        row = await cur.fetchone()
        assert row is not None
    ident = str(row[0])
    await entity_names.record(conn, segment, ident, normalized, surface, vector)
    await graph.run(conn, graph.MERGE_ENTITY, {"tenant": tenant, "entity_id": ident, "name": surface})
    return ident


async def _is_stale(conn: AsyncConnection, segment: Segment) -> bool:
    """Whether a turn of the message was corrected since it was sent: the rebuilt segment's own message
    carries the new text, and this one must not be stored over it."""
    cur = await conn.execute(STORED_TURNS, (segment.tenant, segment.conversation_id, [t.turn_id for t in segment.turns]))
    stored = {r[0]: (r[1], r[2], r[3]) for r in await cur.fetchall()}
    # Only a turn stored with other content counts: a missing one is a forget's business (tombstones),
    # and calling it stale would leave the segment pending with nothing to enrich it.
    return any(t.turn_id in stored and stored[t.turn_id] != (t.speaker, t.text, t.ts) for t in segment.turns)


async def skip_reason(conn: AsyncConnection, segment: Segment, prompt_version: str) -> str | None:
    """Why a delivered segment needs no model call: "forgotten" (its row is gone), "done" (already
    enriched by this prompt version, e.g. a redelivery after a crash) or "stale" (a turn in it was
    corrected since it was sent); None when it must be enriched."""
    async with tenant_scope(conn, segment.tenant):
        cur = await conn.execute(SEGMENT_STATUS, (segment.tenant, segment.segment_id))
        row = await cur.fetchone()
        if row is None:
            return "forgotten"
        if row[0] == "enriched" and row[1] == prompt_version:
            return "done"
        return "stale" if await _is_stale(conn, segment) else None


async def store_enrichment(
    conn: AsyncConnection, segment: Segment, enrichment: Enrichment, vectors: np.ndarray, *,
    settings: Settings, prompt_version: str,
) -> StoreCounts | Literal["forgotten", "stale"]:
    """`vectors` rows: the summary, then each gist, then each entity (in `enrichment.entities` order).
    Nothing is stored for a forgotten conversation, or for a message a correction made stale while the
    model read it (the segment row's lock orders this against the correction's rebuild)."""
    tenant, sid = segment.tenant, segment.segment_id
    summary_vector = vectors[0]
    gist_vectors = vectors[1 : 1 + len(enrichment.gists)]
    entity_vectors = dict(zip(enrichment.entities, vectors[1 + len(enrichment.gists):], strict=True))
    similar = mentions = 0
    async with tenant_scope(conn, tenant):
        # Holds off a concurrent forget until this commits; a forget that came first left a tombstone.
        if is_forgotten(await guard(conn, tenant, [segment.conversation_id]), segment.conversation_id):
            return "forgotten"
        cur = await conn.execute(LOCK_SEGMENT, (tenant, sid))
        if await cur.fetchone() is None:
            return "forgotten"  # since it was closed: nothing to store
        if await _is_stale(conn, segment):
            return "stale"
        await graph.delete_segment(conn, tenant, sid)
        await conn.execute(DELETE_FACTS, (tenant, sid))
        await conn.execute(DELETE_GISTS, (tenant, sid))
        await entity_names.forget_segment(conn, tenant, sid)
        # In name order, not the model's: two enrichments of one tenant then lock entity rows in the
        # same order and cannot deadlock.
        ids = {
            name: await _entity(conn, segment, name, enrichment.entities[name], entity_vectors[name],
                                settings.entity_merge_cutoff)
            for name in sorted(enrichment.entities)
        }
        for gist, vector in zip(enrichment.gists, gist_vectors, strict=True):
            await conn.execute(INSERT_GIST, (
                tenant, gist.gist_id, segment.conversation_id, sid, gist.ordinal, gist.text, gist.event_date,
                gist.precision, list(gist.turn_ids), gist.said_at, vector,
            ))
            await graph.run(conn, graph.CREATE_GIST, {
                "tenant": tenant, "gist_id": gist.gist_id, "segment_id": sid,
                "conversation_id": segment.conversation_id, "text": gist.text,
                "event_date": gist.event_date.isoformat(), "said_at": gist.said_at.isoformat(),
            })
            for name in enrichment.mentions.get(gist.gist_id, []):
                await conn.execute(INSERT_MENTION, (tenant, gist.gist_id, ids[name]))
                await graph.run(conn, graph.CREATE_MENTION, {
                    "tenant": tenant, "gist_id": gist.gist_id, "entity_id": ids[name], "segment_id": sid,
                })
                mentions += 1
            # Neighbours through the HNSW index: gists stored before this one, never all pairs.
            cur = await conn.execute(SIMILAR_GISTS, (vector, tenant, gist.gist_id, vector, SIMILAR_CANDIDATES))
            for other_id, similarity in await cur.fetchall():
                if similarity <= settings.similar_cutoff:
                    break
                await graph.run(conn, graph.CREATE_SIMILAR, {
                    "tenant": tenant, "gist_id": gist.gist_id, "other_id": other_id,
                    "similarity": round(float(similarity), 4), "segment_id": sid,
                })
                similar += 1
        # The facts current before these arrive: any that one of them displaces is announced as superseded.
        keys = sorted({(ids[normalize_name(f.subject)], f.predicate) for f in enrichment.facts})
        current_before = await events.current_facts(conn, tenant, keys)
        for fact in enrichment.facts:
            subject_id, object_id = ids[normalize_name(fact.subject)], ids[normalize_name(fact.object)]
            await conn.execute(INSERT_FACT, (
                tenant, fact.fact_id, segment.conversation_id, sid, fact.ordinal, subject_id, fact.predicate,
                object_id, fact.point_in_time, fact.start_time, fact.end_time, list(fact.turn_ids), fact.said_at,
            ))
            await graph.run(conn, graph.CREATE_FACT, {
                "tenant": tenant, "fact_id": fact.fact_id, "segment_id": sid, "subject_id": subject_id,
                "object_id": object_id, "predicate": fact.predicate,
                "point_in_time": _iso(fact.point_in_time), "start_time": _iso(fact.start_time),
                "end_time": _iso(fact.end_time), "said_at": fact.said_at.isoformat(),
            })
        await conn.execute(MARK_ENRICHED, (enrichment.summary, summary_vector, prompt_version, tenant, sid))
        await events.add(conn, await _enrichment_events(conn, segment, enrichment, prompt_version, current_before,
                                                        await events.current_facts(conn, tenant, keys)))
    return StoreCounts(len(enrichment.gists), len(enrichment.facts), len(ids), mentions, similar)


async def _enrichment_events(conn: AsyncConnection, segment: Segment, enrichment: Enrichment, prompt_version: str,
                             before: dict[events.FactKey, str], after: dict[events.FactKey, str]) -> list[MemoryEvent]:
    """segment_enriched, then a fact_superseded per current fact this enrichment displaced. The id covers
    what was stored (texts and facts too), so the same enrichment stored again is the same event."""
    at = await events.now(conn)
    gist_ids, fact_ids = [g.gist_id for g in enrichment.gists], [f.fact_id for f in enrichment.facts]
    identity = (segment.segment_id, prompt_version, [(g.gist_id, g.text) for g in enrichment.gists],
                [(f.fact_id, f.subject, f.predicate, f.object, f.point_in_time, f.start_time, f.end_time)
                 for f in enrichment.facts])
    enriched = new_event("segment_enriched", segment.tenant, segment.conversation_id, at, identity=identity,
                         segment_id=segment.segment_id, gist_ids=gist_ids, fact_ids=fact_ids,
                         gist_count=len(gist_ids), fact_count=len(fact_ids))
    return [enriched, *events.superseded(segment.tenant, segment.conversation_id, at, before, after)]


def _iso(value: date | None) -> str | None:
    return None if value is None else value.isoformat()


def _reason(error: BaseException) -> str:
    # An error's text can quote model output: stored as data, like the output itself.
    return storable(f"{type(error).__name__}: {str(error)[:500]}")


async def mark_failed(conn: AsyncConnection, segment: Segment, error: BaseException) -> None:
    async with tenant_scope(conn, segment.tenant):
        await conn.execute(MARK_FAILED, (_reason(error), segment.tenant, segment.segment_id))


async def mark_waiting(conn: AsyncConnection, segment: Segment, error: BaseException, *, called: bool) -> None:
    """The model was unavailable (`called`) or the breaker is open: the segment waits for a retry."""
    async with tenant_scope(conn, segment.tenant):
        await conn.execute(MARK_WAITING, (int(called), _reason(error), segment.tenant, segment.segment_id))


async def waiting_segments(conn: AsyncConnection, limit: int) -> list[tuple[str, str]]:
    """(tenant, segment_id) of segments waiting for the model, oldest first, across tenants."""
    cur = await conn.execute(WAITING, (limit,))
    return [(str(t), str(s)) for t, s in await cur.fetchall()]
