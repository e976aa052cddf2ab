"""End-to-end ingest (produce turns to Kafka, poll PostgreSQL until every row is stored), and its two baselines
on the same texts: the embedding model alone, and a plain COPY of the finished rows."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb

from epistream.contracts.turns import Turn
from epistream.models.embeddings import Embedder
from epistream.ops.readiness import WaitTimeout, wait_for_turns
from epistream.settings.processes import Settings

from .cleanup import seal_tenant
from .produce import Record, send_burst, send_one_by_one
from .stack import process_cpu_seconds, worker_pid
from .worker_metrics import IngestCounters, scrape

POLL_S = 0.1
# Give up when the stored count has not moved for this long (a stuck or dead worker).
STALL_S = 120.0
# The warm-up may first wait for a cold worker to join its group and drain a backlog.
WARMUP_STALL_S = 600.0


@dataclass(frozen=True)
class IngestFigures:
    turns: int
    produce_s: float  # the producer's own time (all sends acked)
    wall_s: float  # before the first produce -> poll sees the last row
    db_span_s: float  # min(produced_at) -> max(stored_at), from the rows themselves
    latency_p50_s: float
    latency_p95_s: float
    latency_max_s: float
    worker: IngestCounters | None  # deltas over the run, from the worker's /metrics
    worker_cpu_s: float | None  # the worker's CPU time over the run: wall_s * nproc would be every core

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall_s


def wait_for_rows(
    url: str, tenant: str, expected: int, *, stall_s: float = STALL_S, progress_every_s: float = 5.0
) -> float:
    """Poll until `expected` rows of `tenant` are visible; return perf_counter() at that moment."""
    last_print = 0.0

    def show(stored: int, waited_s: float) -> None:
        nonlocal last_print
        if stored < expected and waited_s - last_print >= progress_every_s:
            print(f"    {stored}/{expected} stored", flush=True)
            last_print = waited_s

    try:
        wait_for_turns(url, tenant, expected, stall_s=stall_s, interval_s=POLL_S, on_poll=show)
    except WaitTimeout as exc:
        raise TimeoutError(f"{tenant}: {exc} (see the ingest worker's log under <home>/logs/worker-ingest.log)") from exc
    return time.perf_counter()


@dataclass(frozen=True)
class WarmUp:
    seconds: float
    # Turns sent one at a time meet an idle worker: their latency is the
    # unloaded one, unlike the measured run's, which is mostly queueing.
    latency_p50_s: float
    latency_max_s: float


def warm_up(settings: Settings, url: str, records: list[Record]) -> WarmUp:
    """Push a few turns through the worker (ONNX session, pool, consumer group) and wait for them.

    Every partition must carry a warm-up turn, so that waiting for them also
    drains any backlog the worker had on any partition (the caller sets them).
    """
    tenant = Turn.from_bytes(records[0].value).tenant
    started = time.perf_counter()
    asyncio.run(send_one_by_one(settings, records))
    seconds = wait_for_rows(url, tenant, len(records), stall_s=WARMUP_STALL_S) - started
    seal_tenant(url, tenant)  # its conversations would otherwise close by idleness during the measured run
    latencies, _ = row_timings(url, tenant)
    return WarmUp(seconds, float(np.median(latencies)), float(latencies.max()))


def measure_ingest(settings: Settings, url: str, tenant: str, records: list[Record]) -> IngestFigures:
    """`records` are serialised before the clock starts."""
    before = scrape(settings)
    pid = worker_pid(settings)
    cpu_before = process_cpu_seconds(pid)
    started = time.perf_counter()
    produce_s = asyncio.run(send_burst(settings, records))
    done = wait_for_rows(url, tenant, len(records))
    # At once, before any of its conversations reaches the worker's idle timeout: nothing of this
    # tenant closes from now on, so the run leaves no enrichment work behind.
    seal_tenant(url, tenant)
    cpu_after = process_cpu_seconds(pid)
    time.sleep(0.5)  # the worker observes its histograms just after the commit we saw
    after = scrape(settings)
    latencies, db_span = row_timings(url, tenant)
    p50, p95 = np.percentile(latencies, [50, 95])
    return IngestFigures(
        turns=len(records),
        produce_s=produce_s,
        wall_s=done - started,
        db_span_s=db_span,
        latency_p50_s=float(p50),
        latency_p95_s=float(p95),
        latency_max_s=float(latencies.max()),
        worker=(after - before) if before and after else None,
        worker_cpu_s=(cpu_after - cpu_before) if cpu_before is not None and cpu_after is not None else None,
    )


def row_timings(url: str, tenant: str) -> tuple[np.ndarray, float]:
    """Per-row stored_at - produced_at, and the first-produce-to-last-store span.

    stored_at is now(), i.e. the start of the worker's insert transaction: the row
    becomes visible at its commit, a little later, so these latencies are a lower bound.
    """
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM stored_at - produced_at)::float8 FROM memory.turns WHERE tenant = %s",
            (tenant,),
        ).fetchall()
        span = conn.execute(
            "SELECT extract(epoch FROM max(stored_at) - min(produced_at))::float8 FROM memory.turns WHERE tenant = %s",
            (tenant,),
        ).fetchone()
    return np.array([r[0] for r in rows], dtype=np.float64), float(span[0]) if span else float("nan")


# --- the baselines: the embedding model alone, a plain COPY -----------------------------

# The columns the worker's upsert writes (tsv is generated, stored_at defaulted), in its order, with their types.
COLUMNS = ("tenant", "conversation_id", "turn_id", "speaker", "text", "ts", "session_id", "metadata", "embedding",
           "kafka_partition", "kafka_offset", "produced_at")
TYPES = ("text", "text", "text", "text", "text", "timestamptz", "text", "jsonb", "vector", "int4", "int8", "timestamptz")


@dataclass(frozen=True)
class Timed:
    count: int
    seconds: float
    cpu_s: float | None = None  # this process's CPU time meanwhile: below seconds * nproc means it was not alone

    @property
    def per_s(self) -> float:
        return self.count / self.seconds


def measure_embedding(settings: Settings, texts: list[str]) -> tuple[Timed, np.ndarray]:
    """Sentences/s of Embedder.embed (tokenise + ONNX + pooling), batches of settings.embedding_batch."""
    embedder = Embedder.from_settings(settings)
    embedder.embed(texts[: settings.embedding_batch])  # first run allocates ORT's buffers: not the model's rate
    started, cpu = time.perf_counter(), time.process_time()
    vectors = embedder.embed(texts)
    return Timed(len(texts), time.perf_counter() - started, time.process_time() - cpu), vectors


def _rows(turns: list[Turn], vectors: np.ndarray) -> list[tuple]:
    now = datetime.now(UTC)
    return [(t.tenant, t.conversation_id, t.turn_id, t.speaker, t.text, t.ts, t.session_id, Jsonb(t.metadata), v, i % 4,
             i, now) for i, (t, v) in enumerate(zip(turns, vectors, strict=True))]


def measure_copy(url: str, turns: list[Turn], vectors: np.ndarray, *, run_id: str) -> Timed:
    """Rows/s of one binary COPY into an empty temporary copy of memory.turns (all indexes: PK, btree, GIN,
    HNSW), commit included. A temporary table writes no WAL and lives in temp_buffers (8MB by default)."""
    table = sql.Identifier(f"bench_copy_{run_id}".replace("-", "_"))
    create = sql.SQL("CREATE TEMPORARY TABLE {} (LIKE memory.turns INCLUDING ALL)").format(table)
    rows = _rows(turns, vectors)  # built before the clock: the worker's rows exist before its insert too
    with psycopg.connect(url) as conn:
        register_vector(conn)
        conn.execute(create)
        conn.commit()
        try:
            started = time.perf_counter()
            with conn.cursor() as cur:
                copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
                    table, sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
                )
                with cur.copy(copy_sql) as copy:
                    copy.set_types(list(TYPES))
                    for row in rows:
                        copy.write_row(row)
            conn.commit()
            elapsed = time.perf_counter() - started
            stored = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
            if not stored or stored[0] != len(rows):
                raise RuntimeError(f"COPY stored {stored} rows, expected {len(rows)}")
        finally:
            conn.rollback()
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
            conn.commit()
    return Timed(len(rows), elapsed)
