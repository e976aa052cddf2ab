"""Least privilege in PostgreSQL (sql/017): the workers log in as a role with exactly the application
role's rights, so nothing they run (RESET ROLE included) reaches further; graph ids and tombstones are
out of their reach; the cross-tenant housekeeping functions run with a pinned search path as a role
that may read only the columns they return; `epistream sql` reads one tenant unless told --admin."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from psycopg import errors

from epistream.errors import ServiceError
from epistream.storage.db import (
    APP_ROLE,
    READER_ROLE,
    WORKER_ROLE,
    admin_database_url,
    database_url,
    open_pool,
    tenant_scope,
)

pytestmark = pytest.mark.integration

INSERT_TURN = """
INSERT INTO memory.turns (tenant, conversation_id, turn_id, speaker, text, ts, tz_offset_s, embedding)
VALUES (%s, %s, %s, 'Maya', 'the ferry leaves at nine', now(), 0, %s::vector)
"""
VECTOR = str([1.0] + [0.0] * 383)


def _add_turns(admin_url: str, tenant: str, conversation: str, n: int) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for i in range(n):
            conn.execute(INSERT_TURN, (tenant, conversation, f"t{i}", VECTOR))


def test_a_worker_login_holds_no_more_than_the_application_role_even_after_reset_role(postgres, unique):
    tenant = unique("tenant")
    _add_turns(admin_database_url(postgres), tenant, unique("conv"), 3)
    with psycopg.connect(database_url(postgres), autocommit=True) as conn:
        role = conn.execute("SELECT current_user, rolsuper, rolbypassrls, pg_has_role(current_user, %s, 'MEMBER')"
                            " FROM pg_roles WHERE rolname = current_user", (APP_ROLE,)).fetchone()
        assert role == (WORKER_ROLE, False, False, True)
        conn.execute("RESET ROLE")
        assert conn.execute("SELECT current_user").fetchone() == (WORKER_ROLE,)
        # No tenant named: row-level security still shows nothing, whatever role games were played.
        assert conn.execute("SELECT count(*) FROM memory.turns WHERE tenant = %s", (tenant,)).fetchone() == (0,)
        for escalation in ("SET ROLE postgres", "SET SESSION AUTHORIZATION postgres", "SET ROLE epistream_housekeeper"):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(escalation)
        with conn.transaction():
            conn.execute("SELECT set_config('epistream.tenant', %s, true)", (tenant,))
            assert conn.execute("SELECT count(*) FROM memory.turns").fetchone() == (3,)


def test_the_application_role_cannot_move_graph_ids_or_lift_a_tombstone(postgres, unique):
    tenant = unique("tenant")
    with psycopg.connect(database_url(postgres), autocommit=True) as conn:
        sequences = [r[0] for r in conn.execute(
            "SELECT format('%I.%I', schemaname, sequencename) FROM pg_sequences WHERE schemaname = 'memory_graph'")]
        assert sequences
        for sequence in sequences:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute("SELECT setval(%s::regclass, 1)", (sequence,))
        with conn.transaction():
            conn.execute("SELECT set_config('epistream.tenant', %s, true)", (tenant,))
            conn.execute("INSERT INTO memory.tombstones (tenant, conversation_id) VALUES (%s, 'c')", (tenant,))
        for statement in ("DELETE FROM memory.tombstones WHERE tenant = %s",
                          "UPDATE memory.tombstones SET deleted_at = now() WHERE tenant = %s"):
            with pytest.raises(errors.InsufficientPrivilege), conn.transaction():
                conn.execute("SELECT set_config('epistream.tenant', %s, true)", (tenant,))
                conn.execute(statement, (tenant,))
    with psycopg.connect(admin_database_url(postgres), autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM memory.tombstones WHERE tenant = %s", (tenant,)).fetchone() == (1,)


def test_cross_tenant_functions_pin_their_search_path_and_run_as_a_role_that_reads_only_their_columns(postgres):
    with psycopg.connect(admin_database_url(postgres), autocommit=True) as conn:
        definers = conn.execute(
            "SELECT p.proname, p.proconfig, r.rolname, r.rolsuper FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_roles r ON r.oid = p.proowner"
            " WHERE n.nspname = 'memory' AND p.prosecdef ORDER BY p.proname").fetchall()
        assert [d[0] for d in definers] == ["idle_conversations", "prune_published_events", "unpublished_events",
                                            "unpublished_segments", "vectors_to_reembed", "waiting_segments"]
        for name, config, owner, superuser in definers:
            assert config == ["search_path=pg_catalog, pg_temp"], name
            assert (owner, superuser) == ("epistream_housekeeper", False), name
            assert conn.execute("SELECT has_function_privilege('public', p.oid, 'EXECUTE') FROM pg_proc p"
                                " WHERE p.proname = %s", (name,)).fetchone() == (False,)
        # The owner reads a few columns, writes nothing and cannot log in.
        assert conn.execute(
            "SELECT rolcanlogin, has_table_privilege(rolname, 'memory.turns', 'SELECT'),"
            " has_column_privilege(rolname, 'memory.turns', 'text', 'SELECT'),"
            " has_column_privilege(rolname, 'memory.turns', 'turn_id', 'SELECT'),"
            " has_table_privilege(rolname, 'memory.segments', 'UPDATE')"
            " FROM pg_roles WHERE rolname = 'epistream_housekeeper'").fetchone() == (False, False, False, True, False)
        # Memory events leave their outbox only through the prune (published ones): a worker deletes none.
        assert conn.execute(
            "SELECT has_table_privilege('epistream_housekeeper', 'memory.event_outbox', 'DELETE'),"
            " has_table_privilege('epistream_housekeeper', 'memory.event_outbox', 'UPDATE'),"
            " has_table_privilege('epistream_app', 'memory.event_outbox', 'DELETE')").fetchone() == (True, False, False)


async def test_a_pool_refuses_a_login_that_bypasses_row_level_security(postgres):
    with pytest.raises(ServiceError, match="superuser or bypasses row-level security"):
        await open_pool(postgres, url=admin_database_url(postgres))
    pool = await open_pool(postgres)
    try:
        async with pool.connection() as conn, tenant_scope(conn, "anyone"):
            cur = await conn.execute("SELECT current_user")
            assert await cur.fetchone() == (WORKER_ROLE,)
    finally:
        await pool.close()


def _sql(postgres, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ) | {"EPISTREAM_DATABASE_URL": database_url(postgres),
                              "EPISTREAM_DATABASE_ADMIN_URL": admin_database_url(postgres)}
    return subprocess.run([sys.executable, "-c", "from epistream.apps.cli.main import main; raise SystemExit(main())",
                           "sql", *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_epistream_sql_reads_one_tenant_read_only_and_every_tenant_only_as_admin(postgres, unique):
    mine, theirs = unique("tenant a b\\c"), unique("tenant")  # a name psql's options must keep whole
    conversation = unique("conv")
    _add_turns(admin_database_url(postgres), mine, conversation, 2)
    _add_turns(admin_database_url(postgres), theirs, conversation, 5)
    count = f"SELECT current_user, count(*) FROM memory.turns WHERE conversation_id = '{conversation}'"

    as_tenant = _sql(postgres, "--tenant", mine, "-At", "-c", count)
    assert as_tenant.returncode == 0, as_tenant.stderr
    assert as_tenant.stdout.strip() == f"{READER_ROLE}|2"
    refused = _sql(postgres, "--tenant", mine, "-At", "-c",
                   f"DELETE FROM memory.turns WHERE conversation_id = '{conversation}'")
    assert refused.returncode != 0 and "permission denied" in refused.stderr
    as_admin = _sql(postgres, "--admin", "-At", "-c", f"SELECT count(*) FROM memory.turns WHERE conversation_id = '{conversation}'")
    assert as_admin.returncode == 0 and as_admin.stdout.strip() == "7", as_admin.stderr
    cypher = "SELECT * FROM ag_catalog.cypher('memory_graph', $$ MATCH (g:Gist) RETURN count(g) $$) AS (n ag_catalog.agtype)"
    for scope in (["--admin"], ["--tenant", mine]):  # both sessions have AGE loaded for Cypher
        graph = _sql(postgres, *scope, "-At", "-c", cypher)
        assert graph.returncode == 0 and graph.stdout.strip().isdigit(), graph.stderr
    neither = _sql(postgres, "-c", "SELECT 1")
    assert neither.returncode == 2 and "--tenant" in neither.stderr
