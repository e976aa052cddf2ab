"""Migrations are recorded, applied in order, and harmless to re-run."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.conninfo import make_conninfo

from epistream.storage.db import GRAPH_NAME, admin_database_url, apply_migrations, migration_files

pytestmark = pytest.mark.integration


def test_rerunning_migrations_is_harmless(db_url):
    assert apply_migrations(db_url) == []
    with psycopg.connect(db_url) as conn:
        recorded = [r[0] for r in conn.execute("SELECT name FROM public.epistream_migrations ORDER BY version")]
        extensions = {r[0] for r in conn.execute("SELECT extname FROM pg_extension")}
        graphs = [r[0] for r in conn.execute("SELECT name FROM ag_catalog.ag_graph")]
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'memory'")}
    assert recorded == [path.name for _, path in migration_files()]
    assert {"vector", "age"} <= extensions
    assert graphs.count(GRAPH_NAME) == 1
    assert {"turns_tsv_idx", "turns_embedding_idx", "turns_conversation_time_idx"} <= indexes


def test_partitioning_turns_by_tenant_keeps_rows_views_and_isolation(postgres, unique, tmp_path):
    """sql/014 on a memory that already holds turns: every row moves into the tenant's partition, the
    views over turns still answer, row-level security still binds the application role, and the
    partitions themselves are out of its reach (they would not apply the parent's policy)."""
    name = unique("premigration").replace("-", "_")
    base = admin_database_url(postgres)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(base, dbname=name)
    try:
        before = [(v, p) for v, p in migration_files() if v < 14]
        for _, path in before:
            (tmp_path / path.name).write_text(path.read_text())
        apply_migrations(url, tmp_path)
        tenants = [f"t{n}" for n in range(6)]
        with psycopg.connect(url, autocommit=True) as conn:
            register_vector(conn)
            for n, tenant in enumerate(tenants):
                for turn in range(3):
                    conn.execute(
                        "INSERT INTO memory.turns (tenant, conversation_id, turn_id, speaker, text, ts, embedding,"
                        " embedded_as) VALUES (%s, 'c', %s, 'Ana', %s, now(), %s, 2)",
                        (tenant, f"u{turn}", f"note {n} {turn} about kayaking", np.full(384, 0.1, dtype=np.float32)))
        assert "014_turns_by_tenant.sql" in apply_migrations(url)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT relkind FROM pg_class WHERE oid = 'memory.turns'::regclass").fetchone()[0] == "p"
            parts = conn.execute("SELECT count(*) FROM pg_partition_tree('memory.turns') WHERE isleaf").fetchone()[0]
            assert parts == 16
            assert conn.execute("SELECT count(*) FROM memory.turns WHERE tsv @@ 'kayak'").fetchone()[0] == 18
            stats = conn.execute("SELECT tenant, turns FROM memory.conversation_stats ORDER BY tenant").fetchall()
            assert stats == [(t, 3) for t in tenants]
            conn.execute("SET ROLE epistream_app")
            conn.execute("SELECT set_config('epistream.tenant', 't2', false)")
            assert conn.execute("SELECT DISTINCT tenant FROM memory.turns").fetchall() == [("t2",)]
            assert conn.execute("SELECT tenant, turns FROM memory.conversation_stats").fetchall() == [("t2", 3)]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT count(*) FROM memory_parts.turns_00")
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
