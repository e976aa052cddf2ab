"""The two baselines on the same texts: the embedding model alone, and a plain COPY of the finished rows."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb

from epistream.contracts import Turn
from epistream.embeddings import Embedder
from epistream.settings import Settings

# The columns the worker's upsert writes (tsv is generated, stored_at defaulted), in its order.
COLUMNS = (
    "tenant",
    "conversation_id",
    "turn_id",
    "speaker",
    "text",
    "ts",
    "session_id",
    "metadata",
    "embedding",
    "kafka_partition",
    "kafka_offset",
    "produced_at",
)
TYPES = (
    "text",
    "text",
    "text",
    "text",
    "text",
    "timestamptz",
    "text",
    "jsonb",
    "vector",
    "int4",
    "int8",
    "timestamptz",
)


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
    return [
        (
            t.tenant,
            t.conversation_id,
            t.turn_id,
            t.speaker,
            t.text,
            t.ts,
            t.session_id,
            Jsonb(t.metadata),
            v,
            i % 4,
            i,
            now,
        )
        for i, (t, v) in enumerate(zip(turns, vectors, strict=True))
    ]


def measure_copy(url: str, turns: list[Turn], vectors: np.ndarray, *, temporary: bool, run_id: str) -> Timed:
    """Rows/s of one binary COPY into an empty copy of memory.turns (all indexes: PK, btree, GIN, HNSW), commit included.

    A temporary table writes no WAL and lives in temp_buffers (8MB by default);
    the logged variant pays for WAL like the real table does, so both are kept.
    """
    name = sql.Identifier(f"bench_copy_{run_id}".replace("-", "_"))
    table = name if temporary else sql.SQL("public.{}").format(name)
    create = sql.SQL("CREATE {} TABLE {} (LIKE memory.turns INCLUDING ALL)").format(
        sql.SQL("TEMPORARY" if temporary else ""), table
    )
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
