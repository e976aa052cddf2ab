"""Reading back what the stack did, from its public surfaces: the topics (from offsets taken before the
scenario; answers read committed-only, as a transactional consumer would) and the tables of sql/, read as
the login role (row-level security binds only the workers' role)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from psycopg import sql

from epistream.contracts.dead_letters import DeadLetter
from epistream.messaging.kafka_io import create_consumer
from epistream.messaging.topics import log_offsets
from epistream.settings.processes import Settings

Offsets = dict[str, dict[int, int]]


async def topic_ends(settings: Settings, topics: Collection[str]) -> Offsets:
    """Each topic's end offsets now: where a scenario's records will start."""
    return {t: {p: end for p, (_, end) in (await log_offsets(settings, t)).items()} for t in topics}


async def read_since(settings: Settings, topic: str, start: dict[int, int], *, keys: Collection[bytes] | None = None,
                     timeout_s: float = 120.0) -> list[ConsumerRecord]:
    """Every record of `topic` from `start` to the current end (committed records only), optionally
    only those with one of `keys`."""
    consumer = create_consumer(settings, group_id=None, enable_auto_commit=False, isolation_level="read_committed")
    await consumer.start()
    found: list[ConsumerRecord] = []
    try:
        spans = await log_offsets(settings, topic)
        partitions = [TopicPartition(topic, p) for p in spans]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)  # the last stable offsets, read_committed
        for tp in partitions:
            consumer.seek(tp, max(start.get(tp.partition, 0), spans[tp.partition][0]))
        todo = {tp for tp in partitions if await consumer.position(tp) < ends[tp]}
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            batches = await consumer.getmany(*todo, timeout_ms=500)
            for records in batches.values():
                found.extend(r for r in records if keys is None or r.key in keys)
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()
    return found


def letters(records: list[ConsumerRecord]) -> list[DeadLetter]:
    out = []
    for record in records:
        try:
            out.append(DeadLetter.from_bytes(record.value))
        except ValueError:
            continue  # not a letter: nothing a check could use
    return out


@dataclass(frozen=True)
class StoredTurn:
    conversation_id: str
    turn_id: str
    speaker: str
    text: str
    ts: datetime
    session_id: str | None
    metadata: dict[str, Any]


@dataclass(frozen=True)
class StoredSegment:
    conversation_id: str
    segment_id: str
    seq: int
    turn_ids: tuple[str, ...]
    overlap_turns: int
    close_reason: str
    status: str
    published: bool


def turns_of(url: str, tenant: str) -> list[StoredTurn]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT conversation_id, turn_id, speaker, text, ts, session_id, metadata "
                            "FROM memory.turns WHERE tenant = %s", (tenant,)).fetchall()
    return [StoredTurn(*row) for row in rows]


def segments_of(url: str, tenant: str) -> list[StoredSegment]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT conversation_id, segment_id, seq, turn_ids, overlap_turns, close_reason, status, "
                            "published_at IS NOT NULL FROM memory.segments WHERE tenant = %s "
                            "ORDER BY conversation_id, seq", (tenant,)).fetchall()
    return [StoredSegment(c, s, q, tuple(t), o, r, st, p) for c, s, q, t, o, r, st, p in rows]


# What a forgotten conversation may leave: rows by conversation id, graph elements by their
# conversation's segment ids (every Gist vertex and edge carries its segment_id, "<conversation>#<seq>").
_BY_CONVERSATION = sql.SQL("SELECT count(*) FROM memory.{} WHERE tenant = %(tenant)s "
                           "AND conversation_id = %(conversation)s")
# agtype prints a map as JSON: its properties are read as jsonb.
_GRAPH_BY_SEGMENT = sql.SQL("SELECT count(*) FROM memory_graph.{} WHERE (properties::text::jsonb) ->> 'tenant' = "
                            "%(tenant)s AND starts_with((properties::text::jsonb) ->> 'segment_id', "
                            "%(conversation)s || '#')")
LEFTOVER_QUERIES: dict[str, sql.Composable] = {
    **{table: _BY_CONVERSATION.format(sql.Identifier(table))
       for table in ("turns", "segmenter_state", "segments", "gists", "facts")},
    "gist_mentions": sql.SQL("SELECT count(*) FROM memory.gist_mentions WHERE tenant = %(tenant)s "
                             "AND starts_with(gist_id, %(conversation)s || '#')"),
    **{f"graph {label}": _GRAPH_BY_SEGMENT.format(sql.Identifier(label))
       for label in ("Gist", "MENTIONS", "FACT", "SIMILAR")},
}


def leftovers(url: str, tenant: str, conversation: str) -> dict[str, int]:
    """Everything still held of a forgotten conversation, by table or graph label (all zero when clean)."""
    params = {"tenant": tenant, "conversation": conversation}
    found: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        conn.execute("LOAD 'age'")
        for name, query in LEFTOVER_QUERIES.items():
            try:
                found[name] = int(conn.execute(query, params).fetchone()[0])  # type: ignore[index]
            except psycopg.Error as exc:  # a query this schema cannot answer is a failed check, said so
                conn.rollback()
                found[f"{name} (unreadable: {type(exc).__name__})"] = -1
    return found


def read_topic_sync(settings: Settings, topic: str, start: dict[int, int], keys: Collection[bytes] | None = None,
                    ) -> list[ConsumerRecord]:
    return asyncio.run(read_since(settings, topic, start, keys=keys))
