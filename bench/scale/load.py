"""Growing the scale database: COPY the next turns (with their precomputed vectors) into memory.turns,
with every index in place, and time the same rows into an index-free table as the storage limit.

COPY, not the worker: this is the storage side of ingest at each size (what a row costs with the
HNSW, GIN and btree indexes of a memory this large). The worker's own rate on the same texts is
measured end to end by bench.ingest.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from epistream.contracts.turns import Turn
from epistream.models.embeddings import TURN_EMBEDDING_VERSION
from epistream.storage.db import EMBEDDER_SETTING

COLUMNS = ("tenant", "conversation_id", "turn_id", "speaker", "text", "ts", "tz_offset_s", "session_id",
           "embedding", "embedded_as")
TYPES = ("text", "text", "text", "text", "text", "timestamptz", "int4", "text", "vector", "int2")
#: Same columns, no index at all: what the rows cost to write with nothing to maintain.
PROBE_TABLE = sql.Identifier("public", "scale_probe_turns")
TURNS_TABLE = sql.Identifier("memory", "turns")
PROBE_DDL = sql.SQL("""
CREATE UNLOGGED TABLE IF NOT EXISTS {} (
    tenant text NOT NULL, conversation_id text NOT NULL, turn_id text NOT NULL, speaker text NOT NULL,
    text text NOT NULL, ts timestamptz NOT NULL, tz_offset_s integer NOT NULL, session_id text,
    embedding vector(384) NOT NULL, embedded_as smallint NOT NULL,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', coalesce(speaker, '') || ' ' || text)) STORED,
    speaker_key text GENERATED ALWAYS AS (lower(speaker)) STORED)
""").format(PROBE_TABLE)


@dataclass(frozen=True)
class LoadFigures:
    rows: int
    seconds: float  # COPY into memory.turns with its indexes, and the commit
    probe_rows: int
    probe_seconds: float  # the probe's rows into the index-free table (same tsvector work)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else float("nan")

    @property
    def probe_rows_per_s(self) -> float:
        return self.probe_rows / self.probe_seconds if self.probe_seconds else float("nan")

    @property
    def index_ms_per_row(self) -> float:
        """What the indexes add to a row: the indexed per-row time less the index-free one."""
        return 1000 * (self.seconds / self.rows - self.probe_seconds / self.probe_rows)


def _rows(turns: Sequence[Turn], vectors: np.ndarray) -> Iterable[tuple]:
    for turn, vector in zip(turns, vectors, strict=True):
        yield (turn.tenant, turn.conversation_id, turn.turn_id, turn.speaker, turn.text, turn.ts,
               int(turn.ts.utcoffset().total_seconds()), turn.session_id, vector,  # type: ignore[union-attr]
               TURN_EMBEDDING_VERSION)


def copy_rows(conn: psycopg.Connection, table: sql.Identifier, turns: Sequence[Turn], vectors: np.ndarray) -> float:
    """COPY (binary) the rows into `table` in one transaction; the seconds it took, commit included."""
    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur:
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            table, sql.SQL(", ").join(map(sql.Identifier, COLUMNS)))
        with cur.copy(statement) as copy:
            copy.set_types(list(TYPES))
            for row in _rows(turns, vectors):
                copy.write_row(row)
    return time.perf_counter() - started


def prepare(conn: psycopg.Connection, embedded_by: str) -> None:
    """Vectors as vectors, the probe table, and the model the rows' vectors came from (memory.turns
    records it from the connection, sql/018: dense reads compare only the configured model's)."""
    register_vector(conn)
    conn.execute("SELECT set_config(%s, %s, false)", (EMBEDDER_SETTING, embedded_by))
    conn.execute(PROBE_DDL)


def grow(conn: psycopg.Connection, batches: Iterable[tuple[list[Turn], np.ndarray]], *,
         probe_rows: int = 10_000) -> LoadFigures:
    """COPY every batch into memory.turns; the first `probe_rows` rows also go to the probe table
    (timed on their own, then emptied) for the index-free rate on the same rows."""
    rows = probed = 0
    seconds = probe_s = 0.0
    for turns, vectors in batches:
        if probed < probe_rows:
            take = min(len(turns), probe_rows - probed)
            probe_s += copy_rows(conn, PROBE_TABLE, turns[:take], vectors[:take])
            probed += take
        seconds += copy_rows(conn, TURNS_TABLE, turns, vectors)
        rows += len(turns)
    conn.execute(sql.SQL("TRUNCATE {}").format(PROBE_TABLE))
    return LoadFigures(rows, seconds, probed, probe_s)


@dataclass(frozen=True)
class BulkFigures:
    """A large step done as a restore would: the HNSW index dropped, the rows copied, the index built once,
    and then the last rows copied with every index in place (what a turn costs to write at that size)."""

    bulk_rows: int
    bulk_seconds: float  # COPY without HNSW (GIN and B-trees in place)
    hnsw_build_seconds: float
    maintenance_work_mem: str
    tail: LoadFigures  # the last batch, every index in place

    def as_dict(self) -> dict:
        return {"bulk_rows": self.bulk_rows, "bulk_seconds": round(self.bulk_seconds, 2),
                "bulk_rows_per_s": round(self.bulk_rows / self.bulk_seconds, 1) if self.bulk_seconds else None,
                "hnsw_build_seconds": round(self.hnsw_build_seconds, 2),
                "maintenance_work_mem": self.maintenance_work_mem}


HNSW_INDEX = "turns_embedding_idx"


def grow_bulk(conn: psycopg.Connection, batches: Sequence[tuple[list[Turn], np.ndarray]], *,
              maintenance_work_mem: str) -> BulkFigures:
    """Every batch but the last with the HNSW index dropped, then the index rebuilt from its own
    definition (timed), then the last batch through `grow` with every index in place."""
    if len(batches) < 2:
        raise ValueError("a bulk step needs at least two batches (the bulk and the tail)")
    definition = conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'memory' AND indexname = %s",
                              (HNSW_INDEX,)).fetchone()
    if definition is None:
        raise SystemExit(f"memory.{HNSW_INDEX} is missing: not a database this bench migrated")
    conn.execute(sql.SQL("DROP INDEX memory.{}").format(sql.Identifier(HNSW_INDEX)))
    rows, seconds = 0, 0.0
    for turns, vectors in batches[:-1]:
        seconds += copy_rows(conn, TURNS_TABLE, turns, vectors)
        rows += len(turns)
    conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (maintenance_work_mem,))
    started = time.perf_counter()
    # pg_indexes' own text of our migration's index, not input; on a partitioned table it reads
    # "ON ONLY", which would build the parent's entry alone: every partition's graph is wanted.
    conn.execute(definition[0].replace(" ON ONLY ", " ON ", 1))
    build = time.perf_counter() - started
    conn.execute("RESET maintenance_work_mem")
    return BulkFigures(rows, seconds, build, maintenance_work_mem, grow(conn, batches[-1:]))
