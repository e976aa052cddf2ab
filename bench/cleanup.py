"""Leaving no benchmark data behind, and no enrichment work queued for the model server.

Queries here run as the login role without SET ROLE: a superuser, so
row-level security does not apply and every tenant's rows are visible.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from epistream.messaging.kafka_io import consumer_lag
from epistream.messaging.topics import delete_records, log_offsets
from epistream.pipeline.store.forget import ADD_TOMBSTONE, forget
from epistream.pipeline.store.tombstones import WHOLE_TENANT
from epistream.settings.processes import Settings

BENCH_PREFIX = "bench-"


async def _connect(url: str) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(url)
    # What the worker pool sets up, minus SET ROLE: AGE for the graph deletes, its schema for agtype.
    await conn.execute("LOAD 'age'")
    await conn.execute("SET search_path = memory, ag_catalog, public")
    await conn.commit()
    return conn


def seal_tenant(url: str, tenant: str) -> None:
    """A tombstone for the whole tenant, rows untouched: turns still queued are skipped and idle-close
    requests become no-ops, so no segment of this tenant closes from now on."""
    with psycopg.connect(url) as conn:
        conn.execute(ADD_TOMBSTONE, (tenant, WHOLE_TENANT))


def forget_tenants(url: str, tenants: Sequence[str]) -> dict[str, int]:
    """Delete every row and graph element of these tenants (the product's own `forget`); return the counts.

    The tombstone that `forget` writes stays: the bench's turns are still in
    Kafka, and it is what keeps a replay of memory.turns from bringing them back.
    """

    async def run() -> dict[str, int]:
        totals: dict[str, int] = {}
        conn = await _connect(url)
        try:
            for tenant in tenants:
                done = await forget(conn, tenant)
                for table, n in {**done.rows, "graph_elements": done.graph_elements}.items():
                    totals[table] = totals.get(table, 0) + n
        finally:
            await conn.close()
        return totals

    return asyncio.run(run())


@dataclass(frozen=True)
class Purge:
    dropped_messages: int  # messages the indexer had not committed yet (the one in flight included)
    requeued_other_segments: int


# The worker's outbox: segments with published_at NULL are sent again by its housekeeping timer.
REQUEUE_OTHERS = """
UPDATE memory.segments SET published_at = NULL
WHERE status = 'pending' AND published_at IS NOT NULL AND NOT starts_with(tenant, %s)
"""


def drop_queued_segments(settings: Settings, url: str) -> Purge:
    """Empty memory.segments, then have the worker re-send other tenants' pending segments.

    Forgetting a tenant does not stop its queued segments: the enrich agent
    calls the model before it finds the segment gone, so a cut-off run would
    leave hours of model time queued ahead of everyone. Kafka's DeleteRecords
    moves the log start to the end; the worker's next fetch is out of range and
    resets to it (auto_offset_reset=earliest), while the segment in flight
    finishes. Other tenants' segments still pending get published_at = NULL:
    the worker's outbox (housekeeping, every few seconds) sends them again, so
    none is lost; one in flight may be enriched twice, which replaces its output.
    Segments the worker has already fetched are still in its memory: restart it
    afterwards (stack.restart_ingest_worker) to drop those too.
    """
    dropped = asyncio.run(_delete_to_end(settings))
    with psycopg.connect(url) as conn:
        requeued = conn.execute(REQUEUE_OTHERS, (BENCH_PREFIX,)).rowcount
    return Purge(dropped, requeued)


async def _delete_to_end(settings: Settings) -> int:
    """Delete memory.segments up to its end; return how many messages the indexer had not committed yet."""
    topic = settings.topic_segments
    queued = (await consumer_lag(settings, settings.indexer_group, [topic])).get(topic, 0)
    spans = await log_offsets(settings, topic)
    await delete_records(settings, topic, {p: end for p, (start, end) in spans.items() if end > start})
    return int(queued)
