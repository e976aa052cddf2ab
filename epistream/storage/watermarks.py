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

#: (topic, partition) -> the highest offset stored through.
Through = dict[tuple[str, int], int]

# greatest(): a late batch of a partition's previous owner, or a replay, never lowers the mark.
ADVANCE = """
INSERT INTO memory.ingest_watermarks AS w (topic, kafka_partition, stored_through)
VALUES (%s, %s, %s)
ON CONFLICT (topic, kafka_partition) DO UPDATE
SET stored_through = greatest(w.stored_through, EXCLUDED.stored_through), updated_at = now()
WHERE EXCLUDED.stored_through > w.stored_through
"""

READ = """
SELECT kafka_partition, stored_through FROM memory.ingest_watermarks
WHERE topic = %s AND kafka_partition = ANY(%s)
"""
READ_ALL = "SELECT kafka_partition, stored_through FROM memory.ingest_watermarks WHERE topic = %s"
# Only the mark as it was read: one raised since (a new incarnation's turns stored) is left alone.
FORGET = """
UPDATE memory.ingest_watermarks SET stored_through = -1, updated_at = now()
WHERE topic = %s AND kafka_partition = %s AND stored_through = %s
"""


def through_of(records: Iterable[tuple[str, int, int]], into: Through | None = None) -> Through:
    """Per (topic, partition), the highest offset among `records` (topic, partition, offset), merged
    into `into` (a new dict when None)."""
    marks: Through = dict(into) if into is not None else {}
    for topic, partition, offset in records:
        key = (topic, partition)
        if offset > marks.get(key, -1):
            marks[key] = offset
    return marks


async def advance(conn: AsyncConnection, through: Mapping[tuple[str, int], int]) -> None:
    """Raise the marks inside the caller's transaction. Rows are locked in (topic, partition) order,
    so two workers of a rebalance that both hold rows cannot deadlock each other."""
    if not through:
        return
    async with conn.cursor() as cur:
        await cur.executemany(ADVANCE, [(topic, partition, offset)
                                        for (topic, partition), offset in sorted(through.items())])


async def stored_through(pool: AsyncConnectionPool, topic: str, partitions: Iterable[int] | None = None) -> dict[int, int]:
    """The mark of each of `partitions` (None: all) of `topic` that ingest has stored anything of (one
    index lookup)."""
    async with pool.connection() as conn, conn.cursor() as cur:
        if partitions is None:
            await cur.execute(READ_ALL, (topic,))
        else:
            await cur.execute(READ, (topic, sorted(set(partitions))))
        return {int(p): int(o) for p, o in await cur.fetchall()}


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
