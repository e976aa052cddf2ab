"""The memory-event outbox (sql/020): writers add events inside the transaction of the change they
announce; the relay (epistream.pipeline.event_relay) reads, marks and prunes them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from epistream.contracts.events import MemoryEvent, new_event
from epistream.contracts.turns import Turn

from ..records import RawRecord

# Events of one tenant take their `seq` in commit order: a transaction adding events holds the tenant's
# outbox lock from its first event to its commit, so a later one waits and takes a later seq. Without it
# a transaction that took seq 100 could commit after one that took 101, and the relay publish 101 before
# 100 exists (issue 39). Held only for the tail of the transaction (events are added last).
TENANT_ORDER_LOCK = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
OUTBOX_LOCK_CLASS = 0x6F62  # "ob": this lock's class (the relay's lock is a one-key lock)
# A replay of the same change finds its event already there (same id): nothing is added.
ADD_EVENT = """
INSERT INTO memory.event_outbox (tenant, event_id, conversation_id, payload) VALUES (%s, %s, %s, %s)
ON CONFLICT (tenant, event_id) DO NOTHING
"""
NOW = "SELECT now()"  # the transaction's start: every event of one transaction tells the same time
CLOSED_SEGMENTS = """
SELECT segment_id, conversation_id, turn_ids FROM memory.segments WHERE tenant = %s AND segment_id = ANY(%s)
"""
# The current fact of one (subject, predicate): memory.current_facts is the one definition of "current".
# One key at a time: constants reach the view's DISTINCT ON (an index probe), where a join with a list of
# keys made PostgreSQL rank every fact of the tenant.
CURRENT_FACT = "SELECT fact_id FROM memory.current_facts WHERE tenant = %s AND subject_id = %s AND predicate = %s"
UNPUBLISHED = "SELECT tenant, seq FROM memory.unpublished_events(%s, %s)"
LOAD = "SELECT seq, conversation_id, payload FROM memory.event_outbox WHERE tenant = %s AND seq = ANY(%s) ORDER BY seq"
MARK_PUBLISHED = "UPDATE memory.event_outbox SET published_at = now() WHERE tenant = %s AND seq = ANY(%s)"
PRUNE = "SELECT memory.prune_published_events(%s::interval)"

#: (subject_id, predicate): what a fact is current for.
FactKey = tuple[str, str]


async def now(conn: AsyncConnection) -> datetime:
    cur = await conn.execute(NOW)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def add(conn: AsyncConnection, events: Sequence[MemoryEvent]) -> None:
    """Call inside the transaction (and tenant scope) of the change the events announce, at its end
    (the tenant's outbox lock is held from here to the commit)."""
    for tenant in sorted({event.tenant for event in events}):  # sorted: two transactions never lock crosswise
        await conn.execute(TENANT_ORDER_LOCK, (OUTBOX_LOCK_CLASS, tenant))
    for event in events:
        await conn.execute(ADD_EVENT, (event.tenant, event.event_id, event.conversation_id or "",
                                       Jsonb(event.model_dump(mode="json", exclude_none=True))))


async def turns_stored(conn: AsyncConnection, tenant: str,
                       written: Sequence[tuple[Turn, RawRecord, str]]) -> list[MemoryEvent]:
    """One turns_stored event per conversation of a chunk (its turns, with each one's record and upsert
    outcome, in partition order), through the position of its last turn; none for a conversation whose
    turns all were stored already (a replay changes nothing, so it announces nothing)."""
    by_conversation: dict[str, list[tuple[Turn, RawRecord, str]]] = {}
    for item in written:
        by_conversation.setdefault(item[0].conversation_id, []).append(item)
    changed = {c: w for c, w in by_conversation.items() if any(o != "unchanged" for _, _, o in w)}
    if not changed:
        return []
    at = await now(conn)
    events = []
    for conversation_id, items in changed.items():
        last = items[-1][1]
        turn_ids = [t.turn_id for t, _, _ in items]
        events.append(new_event(
            "turns_stored", tenant, conversation_id, at, identity=(last.partition, last.offset, turn_ids),
            partition=last.partition, offset=last.offset, first_turn_id=turn_ids[0], last_turn_id=turn_ids[-1],
            turn_count=len(turn_ids)))
    return events


async def segments_closed(conn: AsyncConnection, tenant: str, segment_ids: Sequence[str]) -> list[MemoryEvent]:
    """A segment_closed event per segment (in the given order), from its row as this transaction wrote it."""
    if not segment_ids:
        return []
    cur = await conn.execute(CLOSED_SEGMENTS, (tenant, list(segment_ids)))
    rows = {r[0]: r for r in await cur.fetchall()}
    at = await now(conn)
    events = []
    for sid in segment_ids:
        if sid not in rows:
            continue
        _, conversation_id, turn_ids = rows[sid]
        events.append(new_event("segment_closed", tenant, conversation_id, at, identity=(sid, turn_ids),
                                segment_id=sid, first_turn_id=turn_ids[0], last_turn_id=turn_ids[-1],
                                turn_count=len(turn_ids)))
    return events


async def current_facts(conn: AsyncConnection, tenant: str, keys: Sequence[FactKey]) -> dict[FactKey, str]:
    """The current fact id of each (subject, predicate) that has one."""
    current = {}
    for key in keys:
        row = await (await conn.execute(CURRENT_FACT, (tenant, *key))).fetchone()
        if row is not None:
            current[key] = str(row[0])
    return current


def superseded(tenant: str, conversation_id: str, at: datetime, before: dict[FactKey, str],
               after: dict[FactKey, str]) -> list[MemoryEvent]:
    """A fact_superseded event for each (subject, predicate) whose current fact changed to another.
    (`conversation_id`: the conversation whose enrichment superseded it, the event's key.)"""
    return [new_event("fact_superseded", tenant, conversation_id, at, identity=(old, after[key]),
                      fact_id=old, superseded_by=after[key])
            for key, old in sorted(before.items()) if key in after and after[key] != old]


async def unpublished(conn: AsyncConnection, limit: int, skip: Sequence[str] = ()) -> list[tuple[str, int]]:
    """(tenant, seq) of unpublished events across tenants but `skip`, oldest first."""
    cur = await conn.execute(UNPUBLISHED, (limit, list(skip)))
    return [(str(t), int(s)) for t, s in await cur.fetchall()]


async def load(conn: AsyncConnection, tenant: str, seqs: Sequence[int]) -> list[tuple[int, str, dict]]:
    """(seq, key, payload) of these events of `tenant`, in order; call inside its tenant scope."""
    cur = await conn.execute(LOAD, (tenant, list(seqs)))
    return [(int(r[0]), str(r[1]), r[2]) for r in await cur.fetchall()]


async def mark_published(conn: AsyncConnection, tenant: str, seqs: Sequence[int]) -> None:
    await conn.execute(MARK_PUBLISHED, (tenant, list(seqs)))


async def prune(conn: AsyncConnection, keep_s: float) -> int:
    cur = await conn.execute(PRUNE, (timedelta(seconds=keep_s),))
    row = await cur.fetchone()
    return int(row[0]) if row else 0
