"""PostgreSQL: connection string, pool with per-connection setup, migrations."""

from __future__ import annotations

import functools
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
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool
from pydantic import SecretStr

from epistream.errors import ServiceError
from epistream.settings.processes import Settings

log = logging.getLogger(__name__)

# Package data: in a checkout epistream/sql is a link to the repository's sql/, and a wheel ships the files.
SQL_DIR: Traversable = resources.files("epistream") / "sql"
MIGRATION_NAME = re.compile(r"[0-9]{3}_.*\.sql")
GRAPH_NAME = "memory_graph"
SET_TENANT = "SELECT set_config('epistream.tenant', %s, true)"
DATABASE_NAME = "epistream"
_MIGRATION_LOCK = 0x6570_6973  # "epis": serialises concurrent migrators


#: The group role every tenant policy binds (sql/007); the worker login inherits exactly its rights.
APP_ROLE = "epistream_app"
#: The workers' login (sql/017): no superuser, no BYPASSRLS, nothing more than APP_ROLE.
WORKER_ROLE = "epistream_worker"
#: People's login for `epistream sql --tenant` (sql/017): SELECT only, under the same policies.
READER_ROLE = "epistream_reader"
_PRIVILEGED_LOGIN = "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"


def embedded_uri_file(settings: Settings) -> Path:
    return settings.state_dir / "run" / "postgres.uri"


def _embedded_uri(settings: Settings) -> str:
    uri_file = embedded_uri_file(settings)
    if not uri_file.exists():
        raise ServiceError(f"embedded PostgreSQL is not running ({uri_file} missing): run `epistream up`")
    return uri_file.read_text().strip()


def login_as(url: str, role: str, password: str | None = None) -> str:
    """`url`'s server and database, logged in as `role` with `password`; never with `url`'s own
    password, which is another login's (none given: libpq's PGPASSWORD, PGPASSFILE, ~/.pgpass; the
    embedded server trusts its socket)."""
    server, _ = split_password(url)
    return make_conninfo(server, user=role, password=password) if password else make_conninfo(server, user=role)


def split_password(url: str) -> tuple[str, str | None]:
    """`url` without its password, and the password (None when it has none, or an empty one): a
    password kept off a command line, where `ps` shows it, can travel in PGPASSWORD instead."""
    params = conninfo_to_dict(url)
    password = params.pop("password", None)
    return make_conninfo("", **params), str(password) if password else None


def database_url(settings: Settings) -> str:
    """The workers' login: the configured one, else the embedded server as epistream_worker."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return login_as(_embedded_uri(settings), WORKER_ROLE)


def read_database_url(settings: Settings) -> str | None:
    """The workers' login to the hot standby reads go to (EPISTREAM_DATABASE_READ_URL); None: the primary."""
    return settings.database_read_url.get_secret_value() if settings.database_read_url is not None else None


def admin_database_url(settings: Settings) -> str:
    """The login that migrates and administers: the configured one, else the embedded superuser."""
    if settings.database_admin_url is not None:
        return settings.database_admin_url.get_secret_value()
    if settings.database_url is not None:
        raise ServiceError("EPISTREAM_DATABASE_ADMIN_URL is not set: the workers' login "
                           "(EPISTREAM_DATABASE_URL) may not migrate or administer")
    return _embedded_uri(settings)


def on_database(settings: Settings, admin_url: str) -> Settings:
    """`settings` turned to another database (a test's or a benchmark's own): `admin_url` migrates and
    inspects it, and the workers log in to it as epistream_worker."""
    password = settings.db_worker_password.get_secret_value() if settings.db_worker_password else None
    return settings.with_overrides(database_admin_url=SecretStr(admin_url),
                                   database_url=SecretStr(login_as(admin_url, WORKER_ROLE, password)))


def tenant_option(tenant: str) -> str:
    """libpq `options` naming the session's tenant. PostgreSQL splits options at whitespace and reads a
    backslash as an escape, so both are escaped: a tenant's name stays one value, whatever it holds."""
    escaped = "".join("\\" + ch if ch == "\\" or ch.isspace() else ch for ch in tenant)
    return f"-c epistream.tenant={escaped}"


def reader_url(settings: Settings, tenant: str) -> str:
    """A read-only login (epistream_reader) on the workers' database, its session scoped to `tenant`.
    The scope keeps a session to one tenant's rows; it is not a wall against the person typing, who
    could name another tenant: people with SQL access are the operators (see the trust model in docs/operations.md).
    Its password is EPISTREAM_DB_READER_PASSWORD; unset, the URL has none, and libpq looks in the
    standard places (PGPASSWORD, PGPASSFILE, ~/.pgpass): the workers' password would only fail the login."""
    password = settings.db_reader_password.get_secret_value() if settings.db_reader_password else None
    return make_conninfo(login_as(database_url(settings), READER_ROLE, password), options=tenant_option(tenant))


async def _refuse_privileged(conn: psycopg.AsyncConnection) -> None:
    cur = await conn.execute(_PRIVILEGED_LOGIN)
    row = await cur.fetchone()
    if row is None or row[0]:
        raise ServiceError(
            f"the workers' database login {conn.info.user!r} is a superuser or bypasses row-level security: "
            f"log in as {WORKER_ROLE} (made by the migrations), and keep the admin login for "
            "EPISTREAM_DATABASE_ADMIN_URL"
        )


#: The embedding model of a pooled connection (sql/018): its writes record it (the columns' default) and
#: its dense reads compare only its vectors (``embedded_by = CONNECTION_EMBEDDER``).
EMBEDDER_SETTING = "epistream.embedder"
CONNECTION_EMBEDDER = sql.SQL("current_setting({})").format(sql.Literal(EMBEDDER_SETTING))
#: The cosine above which the connection's model counts two gists as similar.
CONNECTION_SIMILAR_CUTOFF = sql.SQL("current_setting('epistream.similar_cutoff')::float8")


async def _configure(conn: psycopg.AsyncConnection, *, embedder: str, similar_cutoff: float) -> None:
    # Every pooled connection is a worker's: refused if it could see past row-level security.
    # AGE is loaded by the login role itself (session_preload_libraries, sql/017); pgvector types are
    # registered so embeddings travel as vectors, not strings.
    await _refuse_privileged(conn)
    await conn.execute("SET search_path = memory, ag_catalog, public")
    await conn.execute("SET hnsw.iterative_scan = relaxed_order")
    # psycopg prepares a statement it runs often, and PostgreSQL may then keep one generic plan for
    # every parameter: our optional filters (`$x IS NULL OR ...`) need the plan of their values.
    # At 4,400 turns in one conversation a generic plan made the context read 5-10x slower.
    await conn.execute("SET plan_cache_mode = force_custom_plan")
    # The embedding model whose vectors this connection writes and compares (sql/018), and the cosine its
    # gists count as similar at: one place, so no read compares two models' vectors, every write records
    # its model, and the tools' similar gists match the pipeline's SIMILAR edges under any model.
    await conn.execute("SELECT set_config(%s, %s, false), set_config('epistream.similar_cutoff', %s, false)",
                       (EMBEDDER_SETTING, embedder, str(similar_cutoff)))
    await register_vector_async(conn)
    await conn.commit()


@asynccontextmanager
async def tenant_scope(conn: psycopg.AsyncConnection, tenant: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """A transaction that sees and writes only `tenant`'s rows (row-level security)."""
    async with conn.transaction():
        await conn.execute(SET_TENANT, (tenant,))
        yield conn


def create_pool(settings: Settings, *, url: str | None = None, name: str = "epistream") -> AsyncConnectionPool:
    """A closed pool of worker logins (`url`, else `database_url`); open it with `open_pool`, or with
    ``await pool.open(wait=True)`` inside the event loop. `name` tells its log lines apart."""
    return AsyncConnectionPool(
        url or database_url(settings),
        min_size=settings.db_pool_min,
        max_size=settings.db_pool_max,
        configure=functools.partial(_configure, embedder=settings.embedding_model,
                                    similar_cutoff=settings.similar_cutoff),
        # Each connection is checked as it leaves the pool: after a PostgreSQL restart a dead one is
        # replaced there instead of failing the caller's first query.
        check=AsyncConnectionPool.check_connection,
        timeout=30.0,
        open=False,
        name=name,
    )


async def open_pool(settings: Settings, *, url: str | None = None, name: str = "epistream") -> AsyncConnectionPool:
    """An open pool of worker logins (`url`, else `database_url`): the same per-connection setup on a
    primary or a standby. A privileged login is refused here, with the reason, before the pool would retry
    it until its timeout."""
    url = url or database_url(settings)
    async with await psycopg.AsyncConnection.connect(url, connect_timeout=10) as conn:
        await _refuse_privileged(conn)
    pool = create_pool(settings, url=url, name=name)
    await pool.open(wait=True)
    return pool


def set_login_passwords(admin_url: str, settings: Settings) -> list[str]:
    """Give the worker and reader logins the configured passwords; return the roles changed.
    ALTER ROLE takes no bound parameter: the password goes in as a quoted literal."""
    changed = []
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role, secret in ((WORKER_ROLE, settings.db_worker_password), (READER_ROLE, settings.db_reader_password)):
            if secret is not None and secret.get_secret_value():  # unset or empty: left as it is
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(secret.get_secret_value())))
                changed.append(role)
    return changed


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
            done: dict[int, str] = dict(conn.execute("SELECT version, checksum FROM public.epistream_migrations").fetchall())
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
