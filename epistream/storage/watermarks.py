"""Read-your-own-writes: how far the ingest side has stored each partition of `memory.turns`
(the table of sql/019, docs/read-your-writes.md).

"Stored through offset O" on a partition means: ingest is done with every record of that partition
at or below O. Each turn there is committed to the database, or was found unusable (it will be
dead-lettered with its reason, never stored), or belongs to a forgotten conversation; each control
record there is applied. The ingest worker raises the mark in the same transaction as the chunk it
covers; the answer worker reads it before a read that names `after` positions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from epistream.contracts.positions import Position

#: (topic, partition) -> the offsets a commit is done with, as sorted inclusive runs (first, last).
Runs = dict[tuple[str, int], list[tuple[int, int]]]

# The ranges are added to what is stored, and the mark moves to the end of the run that continues it
# (sql/022): a chunk after a gap raises nothing until the gap is filled, and a replay, or a previous
# owner's late batch, never lowers it.
ADVANCE = """
INSERT INTO memory.ingest_watermarks AS w (topic, kafka_partition, stored, stored_through)
VALUES (%(topic)s, %(partition)s, %(ranges)s::int8multirange,
        memory.watermark_after(%(ranges)s::int8multirange, -1))
ON CONFLICT (topic, kafka_partition) DO UPDATE
SET stored = memory.watermark_fill(w.stored + EXCLUDED.stored, w.stored_through),
    stored_through = memory.watermark_after(w.stored + EXCLUDED.stored, w.stored_through),
    updated_at = now()
"""

READ = """
SELECT kafka_partition, stored_through FROM memory.ingest_watermarks
WHERE topic = %s AND kafka_partition = ANY(%s)
"""
READ_ALL = "SELECT kafka_partition, stored_through FROM memory.ingest_watermarks WHERE topic = %s"
# The first missing run above each mark that has one: [mark + 1, the next stored offset).
GAPS = """
SELECT kafka_partition, stored_through + 1, lower(r) FROM memory.ingest_watermarks,
       LATERAL (SELECT r FROM unnest(stored) r WHERE lower(r) > stored_through + 1 ORDER BY r LIMIT 1) AS next
WHERE topic = %s AND stored_through >= 0
"""
# Marks made on another incarnation of the topic (its id differs) start again from nothing; marks not
# yet tied to one are tied to the current one.
FORGET_OTHER_INCARNATION = """
UPDATE memory.ingest_watermarks SET stored_through = -1, stored = '{}', topic_id = %(id)s, updated_at = now()
WHERE topic = %(topic)s AND topic_id <> %(id)s
RETURNING kafka_partition
"""
ADOPT = "UPDATE memory.ingest_watermarks SET topic_id = %(id)s WHERE topic = %(topic)s AND topic_id IS NULL"
# Only the mark as it was read: one raised since (a new incarnation's turns stored) is left alone.
FORGET = """
UPDATE memory.ingest_watermarks SET stored_through = -1, stored = '{}', updated_at = now()
WHERE topic = %s AND kafka_partition = %s AND stored_through = %s
"""


def runs_of(records: Iterable[tuple[str, int, int]]) -> Runs:
    """Per (topic, partition), the offsets among `records` (topic, partition, offset) as sorted runs of
    consecutive offsets."""
    offsets: dict[tuple[str, int], set[int]] = {}
    for topic, partition, offset in records:
        offsets.setdefault((topic, partition), set()).add(offset)
    runs: Runs = {}
    for key, seen in offsets.items():
        spans: list[tuple[int, int]] = []
        for offset in sorted(seen):
            if spans and offset == spans[-1][1] + 1:
                spans[-1] = (spans[-1][0], offset)
            else:
                spans.append((offset, offset))
        runs[key] = spans
    return runs


def _multirange(spans: list[tuple[int, int]]) -> str:
    return "{" + ",".join(f"[{first},{last + 1})" for first, last in spans) + "}"


async def advance(conn: AsyncConnection, runs: Mapping[tuple[str, int], list[tuple[int, int]]]) -> None:
    """Add the runs to what is stored and move the marks, inside the caller's transaction. Rows are
    locked in (topic, partition) order, so two workers of a rebalance that both hold rows cannot
    deadlock each other."""
    rows = [{"topic": topic, "partition": partition, "ranges": _multirange(spans)}
            for (topic, partition), spans in sorted(runs.items()) if spans]
    if rows:
        async with conn.cursor() as cur:
            await cur.executemany(ADVANCE, rows)


async def gaps(pool: AsyncConnectionPool, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition with a gap above its mark, the first one: (its first offset, the next stored offset)."""
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(GAPS, (topic,))
        return {int(p): (int(first), int(end)) for p, first, end in await cur.fetchall()}


async def stored_through(pool: AsyncConnectionPool, topic: str, partitions: Iterable[int] | None = None) -> dict[int, int]:
    """The mark of each of `partitions` (None: all) of `topic` that ingest has stored anything of (one
    index lookup)."""
    async with pool.connection() as conn, conn.cursor() as cur:
        if partitions is None:
            await cur.execute(READ_ALL, (topic,))
        else:
            await cur.execute(READ, (topic, sorted(set(partitions))))
        return {int(p): int(o) for p, o in await cur.fetchall()}


async def forget_other_incarnation(pool: AsyncConnectionPool, topic: str, current_id: str) -> list[int]:
    """Set to -1 (nothing stored) every mark of `topic` made on an incarnation other than `current_id` (the
    broker's topic id, read after the topic was deleted and created again), and tie the untied marks to
    it. Returns the partitions forgotten. A chunk of the new incarnation stored in between is forgotten
    with them: reads wait for its next chunk, which raises the mark again from its lowest range."""
    async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
        await cur.execute(FORGET_OTHER_INCARNATION, {"topic": topic, "id": current_id})
        forgotten = sorted(int(p) for (p,) in await cur.fetchall())
        await cur.execute(ADOPT, {"topic": topic, "id": current_id})
    return forgotten


def beyond_the_log(marks: Mapping[int, int], ends: Mapping[int, int]) -> dict[int, int]:
    """The marks at or past their partition's end offset, `ends` read after `marks`. Offsets only grow
    within one incarnation of a topic, so such a mark was made by an earlier one (the topic deleted and
    created again, by an operator or a rebuilt cluster): it would call unstored turns stored."""
    return {p: mark for p, mark in marks.items() if p in ends and mark >= ends[p] and mark >= 0}


async def forget_beyond_the_log(pool: AsyncConnectionPool, topic: str,
                                read_ends: Callable[[], Awaitable[Mapping[int, int] | None]]) -> dict[int, int]:
    """Read the topic's marks, then its partitions' end offsets (`read_ends`, None when the broker could
    not say), and set to -1 (nothing stored) each mark beyond its partition's end: reads then wait for
    this incarnation's turns. Returns the marks forgotten."""
    marks = await stored_through(pool, topic)
    ends = await read_ends()
    stale = beyond_the_log(marks, ends or {})
    if stale:
        async with pool.connection() as conn, conn.cursor() as cur:
            await cur.executemany(FORGET, [(topic, p, mark) for p, mark in sorted(stale.items())])
    return stale


def unmet(positions: Sequence[Position], marks: Mapping[int, int]) -> list[Position]:
    """The positions not yet stored through: their partition's mark is missing or below their offset."""
    return [p for p in positions if marks.get(p.partition, -1) < p.offset]
