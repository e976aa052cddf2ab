"""What a memory of this size occupies, and the PostgreSQL settings the figures were taken under."""

from __future__ import annotations

import psycopg

SETTINGS = ("shared_buffers", "work_mem", "maintenance_work_mem", "effective_cache_size", "max_parallel_workers",
            "max_parallel_workers_per_gather", "synchronous_commit", "max_wal_size", "random_page_cost",
            "hnsw.ef_search", "hnsw.iterative_scan", "hnsw.max_scan_tuples", "jit")
INDEXES = ("turns_pkey", "turns_embedding_idx", "turns_tsv_idx", "turns_conversation_time_idx", "turns_speaker_idx")


def disk_usage(conn: psycopg.Connection, turns: int) -> dict:
    """Bytes per turn: the whole table (heap, TOAST, indexes) and each index on its own."""
    total = conn.execute("SELECT pg_total_relation_size('memory.turns')").fetchone()[0]  # type: ignore[index]
    heap = conn.execute("SELECT pg_table_size('memory.turns')").fetchone()[0]  # type: ignore[index]
    by_index = {name: conn.execute("SELECT pg_relation_size(%s::regclass)",
                                   (f"memory.{name}",)).fetchone()[0]  # type: ignore[index]
                for name in INDEXES}
    return {"total_bytes": total, "bytes_per_turn": round(total / turns, 1), "table_bytes_per_turn":
            round(heap / turns, 1), "index_bytes_per_turn": {k: round(v / turns, 1) for k, v in by_index.items()}}


def postgres_settings(conn: psycopg.Connection) -> dict[str, str]:
    conn.execute("LOAD 'vector'")  # its hnsw.* settings exist once the library is loaded
    names = [*SETTINGS, "server_version"]
    values = conn.execute("SELECT n, coalesce(current_setting(n, true), 'unset') FROM unnest(%s::text[]) AS n",
                          (names,)).fetchall()
    return dict(values)
