"""Forgetting that survives a rebuild. `forget_everywhere` writes the erasure to Kafka's compacted
`memory.forgotten` before it deletes anything in PostgreSQL; `catch_up`, run by every worker before
it reads a turn, applies each erasure this database has not seen (a new database, rebuilt from
Kafka, has seen none); `apply` does the same for one record as it arrives."""

from __future__ import annotations

import logging

from psycopg_pool import AsyncConnectionPool

from epistream.client.api import forget as record_forgetting
from epistream.contracts.turns import ForgetRecord
from epistream.core.metrics import Metrics
from epistream.core.retry import BLOCKING, retry
from epistream.messaging.erasure import read_forgotten
from epistream.settings.processes import Settings
from epistream.storage.db import tenant_scope

from .store.forget import Forgotten, forget
from .store.tombstones import WHOLE_TENANT

log = logging.getLogger(__name__)

HAS_TOMBSTONE = "SELECT 1 FROM memory.tombstones WHERE tenant = %s AND conversation_id = %s"


async def forget_everywhere(settings: Settings, pool: AsyncConnectionPool, tenant: str,
                            conversation_id: str | None = None) -> Forgotten:
    """Kafka first: if the erasure cannot be recorded there, nothing is deleted and the caller hears why.
    Deleting first would let a rebuild bring back what PostgreSQL no longer has."""
    await record_forgetting(settings, tenant=tenant, conversation_id=conversation_id)
    async with pool.connection() as conn:
        return await forget(conn, tenant, conversation_id)


async def apply(pool: AsyncConnectionPool, record: ForgetRecord) -> Forgotten | None:
    """Forget what the record names unless this database already holds its tombstone; the forget
    itself is idempotent, the check only spares a known one its deletes."""
    async with pool.connection() as conn:
        async with tenant_scope(conn, record.tenant):
            cur = await conn.execute(HAS_TOMBSTONE, (record.tenant, record.conversation_id or WHOLE_TENANT))
            if await cur.fetchone() is not None:
                return None
        return await forget(conn, record.tenant, record.conversation_id)


async def apply_arriving(pool: AsyncConnectionPool, record: ForgetRecord, metrics: Metrics) -> None:
    """`apply` for a record read as it arrives: transient failures (PostgreSQL restarting) are waited
    out; any other is counted and logged, and the erasure is applied by the next start's `catch_up`
    (its tombstone is not in this database yet)."""
    try:
        await retry(lambda: apply(pool, record), backoff=BLOCKING)
    except Exception as exc:
        metrics.task_failures.labels("erasure", type(exc).__name__).inc()
        log.error("erasure of %r/%r not applied (the next start applies it): %s: %s", record.tenant,
                  record.conversation_id, type(exc).__name__, exc)


async def catch_up(settings: Settings, pool: AsyncConnectionPool) -> int:
    """Apply every erasure of the topic this database lacks; return how many were new to it."""
    records = await read_forgotten(settings)
    applied = 0
    for record in records:
        if await apply(pool, record) is not None:
            applied += 1
    log.info("read %d erasures from %s; applied %d this database had not seen", len(records),
             settings.topic_forgotten, applied)
    return applied
