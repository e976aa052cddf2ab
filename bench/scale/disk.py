"""What a memory of this size occupies, and the PostgreSQL settings the figures were taken under."""

from __future__ import annotations

import psycopg
from psycopg import sql

SETTINGS = ("shared_buffers", "work_mem", "maintenance_work_mem", "effective_cache_size", "max_parallel_workers",
            "max_parallel_workers_per_gather", "synchronous_commit", "max_wal_size", "random_page_cost",
            "hnsw.ef_search", "hnsw.iterative_scan", "hnsw.max_scan_tuples", "jit")
INDEXES = ("turns_pkey", "turns_embedding_idx", "turns_tsv_idx", "turns_conversation_time_idx", "turns_speaker_idx")


def _size(conn: psycopg.Connection, function: str, relation: str) -> int:
    """`function` (pg_total_relation_size, pg_table_size, pg_relation_size) of `relation`, summed over
    its partitions when it has some (a partitioned table or index has no storage of its own)."""
    query = sql.SQL("SELECT coalesce((SELECT sum({f}(relid)) FROM pg_partition_tree(%(r)s::regclass)),"
                    " {f}(%(r)s::regclass))::bigint").format(f=sql.Identifier(function))
    return conn.execute(query, {"r": relation}).fetchone()[0]  # type: ignore[index]


def disk_usage(conn: psycopg.Connection, turns: int) -> dict:
    """Bytes per turn: the whole table (heap, TOAST, indexes) and each index on its own."""
    total = _size(conn, "pg_total_relation_size", "memory.turns")
    heap = _size(conn, "pg_table_size", "memory.turns")
    by_index = {name: _size(conn, "pg_relation_size", f"memory.{name}") for name in INDEXES}
    # BM25's word counts (sql/015) grow with the turns too, kept in a table of their own.
    counts = _size(conn, "pg_total_relation_size", "memory.term_counts")
    return {"total_bytes": total, "bytes_per_turn": round(total / turns, 1), "table_bytes_per_turn":
            round(heap / turns, 1), "index_bytes_per_turn": {k: round(v / turns, 1) for k, v in by_index.items()},
            "term_counts_bytes_per_turn": round(counts / turns, 1)}


def postgres_settings(conn: psycopg.Connection) -> dict[str, str]:
    conn.execute("LOAD 'vector'")  # its hnsw.* settings exist once the library is loaded
    names = [*SETTINGS, "server_version"]
    values = conn.execute("SELECT n, coalesce(current_setting(n, true), 'unset') FROM unnest(%s::text[]) AS n",
                          (names,)).fetchall()
    return dict(values)
