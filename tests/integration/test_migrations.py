"""Migrations are recorded, applied in order, and harmless to re-run."""

from __future__ import annotations

import psycopg
import pytest

from epistream.db import GRAPH_NAME, apply_migrations, migration_files

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
