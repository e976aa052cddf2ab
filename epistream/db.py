"""PostgreSQL: connection string, pool with per-connection setup, migrations."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from .errors import ServiceError
from .settings import Settings

log = logging.getLogger(__name__)

# Package data: in a checkout epistream/sql is a link to the repository's sql/, and a wheel ships the files.
SQL_DIR: Traversable = resources.files("epistream") / "sql"
MIGRATION_NAME = re.compile(r"[0-9]{3}_.*\.sql")
GRAPH_NAME = "memory_graph"
SET_TENANT = "SELECT set_config('epistream.tenant', %s, true)"
DATABASE_NAME = "epistream"
_MIGRATION_LOCK = 0x6570_6973  # "epis": serialises concurrent migrators


def embedded_uri_file(settings: Settings) -> Path:
    return settings.state_dir / "run" / "postgres.uri"


def database_url(settings: Settings) -> str:
    """The external database if configured, else the embedded server's URI."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    uri_file = embedded_uri_file(settings)
    if not uri_file.exists():
        raise ServiceError(f"embedded PostgreSQL is not running ({uri_file} missing): run `epistream up`")
    return uri_file.read_text().strip()


def _configure_with(role: str | None):  # type: ignore[no-untyped-def]
    async def configure(conn: psycopg.AsyncConnection) -> None:
        # AGE needs its library loaded in every session that runs Cypher (before
        # the role switch: loading it may need the login role's rights); pgvector
        # types are registered so embeddings travel as vectors, not strings.
        await conn.execute("LOAD 'age'")
        await conn.execute("SET search_path = memory, ag_catalog, public")
        await conn.execute("SET hnsw.iterative_scan = relaxed_order")
        # psycopg prepares a statement it runs often, and PostgreSQL may then keep one generic plan for
        # every parameter: our optional filters (`$x IS NULL OR ...`) need the plan of their values.
        # At 4,400 turns in one conversation a generic plan made the context read 5-10x slower.
        await conn.execute("SET plan_cache_mode = force_custom_plan")
        if role:
            # Row-level security binds this role: every query sees one tenant.
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        await register_vector_async(conn)
        await conn.commit()

    return configure


@asynccontextmanager
async def tenant_scope(conn: psycopg.AsyncConnection, tenant: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """A transaction that sees and writes only `tenant`'s rows (row-level security)."""
    async with conn.transaction():
        await conn.execute(SET_TENANT, (tenant,))
        yield conn


def create_pool(settings: Settings, *, url: str | None = None) -> AsyncConnectionPool:
    """A closed pool; open it with ``await pool.open(wait=True)`` inside the event loop."""
    return AsyncConnectionPool(
        url or database_url(settings),
        min_size=settings.db_pool_min,
        max_size=settings.db_pool_max,
        configure=_configure_with(settings.db_role or None),
        # Each connection is checked as it leaves the pool: after a PostgreSQL restart a dead one is
        # replaced there instead of failing the caller's first query.
        check=AsyncConnectionPool.check_connection,
        timeout=30.0,
        open=False,
        name="epistream",
    )


def migration_files(sql_dir: Traversable = SQL_DIR) -> list[tuple[int, Traversable]]:
    """Numbered ``NNN_name.sql`` files in order."""
    found = []
    for path in sorted((p for p in sql_dir.iterdir() if MIGRATION_NAME.fullmatch(p.name)), key=lambda p: p.name):
        found.append((int(path.name[:3]), path))
    versions = [v for v, _ in found]
    if len(set(versions)) != len(versions):
        raise ServiceError(f"duplicate migration numbers in {sql_dir}")
    return found


def apply_migrations(url: str, sql_dir: Traversable = SQL_DIR) -> list[str]:
    """Apply pending migrations in order, each in its own transaction; return their names.

    An applied file whose text changed is an error, not a silent re-run.
    """
    applied: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS public.epistream_migrations (
                       version integer PRIMARY KEY,
                       name text NOT NULL,
                       checksum text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = dict(conn.execute("SELECT version, checksum FROM public.epistream_migrations").fetchall())
            for version, path in migration_files(sql_dir):
                text = path.read_text()
                checksum = hashlib.sha256(text.encode()).hexdigest()
                if version in done:
                    if done[version] != checksum:
                        raise ServiceError(f"migration {path.name} changed after it was applied")
                    continue
                with conn.transaction():
                    conn.execute("LOAD 'age'")
                    conn.execute(text)  # trusted: a file of this repository, not user input
                    conn.execute(
                        "INSERT INTO public.epistream_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (version, path.name, checksum),
                    )
                log.info("applied migration %s", path.name)
                applied.append(path.name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return applied
