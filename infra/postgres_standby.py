"""A hot standby of the embedded PostgreSQL on the same machine, by PostgreSQL's own streaming
replication: for the tests and the benchmarks that read from a standby (docs/operations.md#scaling-reads).

The primary needs what a fresh pgserver cluster already has (PostgreSQL's defaults): `wal_level`
replica, WAL senders, and a `local replication` line in pg_hba.conf; `check_primary` says which one is
missing instead of letting pg_basebackup fail obscurely. The standby is a base backup of it
(`pg_basebackup -R`: `standby.signal` and `primary_conninfo` over the primary's Unix socket) with its
own data directory and socket directory, run by `pg_ctl` as the primary's system user. No replication
slot: a standby left behind never makes the primary keep WAL for it."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import psycopg

from epistream.errors import ServiceError

from .postgres_server import PostgresLaunch, bin_dir, socket_dir_for

log = logging.getLogger(__name__)

_REPLICATION_RULE = ("SELECT count(*) FROM pg_hba_file_rules WHERE type = 'local' "
                     "AND 'replication' = ANY(database) AND error IS NULL")
_REPLAYED = "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn"


@dataclass(frozen=True)
class Standby:
    """A running standby: its home (data directory, log), its socket, and the system user it runs as."""

    home: Path
    socket_dir: Path
    user: str | None

    @property
    def pgdata(self) -> Path:
        return self.home / "pgdata"

    @property
    def log_file(self) -> Path:
        return self.home / "postgres.log"

    def uri(self, database: str) -> str:
        """The embedded superuser on the standby (as PostgresLaunch.uri is on the primary)."""
        return f"postgresql://postgres:@/{database}?host={self.socket_dir}"

    def stop(self, *, remove: bool = True) -> None:
        """Stop it (a fast shutdown) and, by default, remove its home."""
        if (self.pgdata / "postmaster.pid").exists():
            _run([str(bin_dir() / "pg_ctl"), "stop", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60"],
                 self.user, check=False)
        if remove:
            shutil.rmtree(self.home, ignore_errors=True)


def _run(argv: list[str], user: str | None, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, user=user, capture_output=True, text=True, timeout=300, check=False)
    if check and done.returncode != 0:
        raise ServiceError(f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done


def _value(conn: psycopg.Connection, query: LiteralString, params: tuple[object, ...] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None, "a query of one row returned none"
    return row[0]


def check_primary(admin_uri: str) -> None:
    """Raise a ServiceError naming what the primary lacks to stream to a standby over its socket."""
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        wal_level = str(_value(conn, "SHOW wal_level"))
        senders = int(_value(conn, "SHOW max_wal_senders"))
        rules = int(_value(conn, _REPLICATION_RULE))
    missing = ([f"wal_level=replica (it is {wal_level})"] if wal_level not in ("replica", "logical") else []) + (
        ["max_wal_senders above 0"] if senders < 1 else []) + (
        ["a `local replication` line in pg_hba.conf"] if rules < 1 else [])
    if missing:
        raise ServiceError("the primary cannot stream to a standby: it needs " + ", ".join(missing))


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def start_standby(primary: PostgresLaunch, home: Path, *, timeout_s: float = 120.0) -> Standby:
    """A hot standby of the running `primary` under `home` (created; it must not exist yet), started and
    accepting reads. Its settings are the primary's command-line ones, on its own socket, no TCP."""
    check_primary(primary.uri("postgres"))
    pgdata = home / "pgdata"
    pgdata.mkdir(parents=True, mode=0o700)
    if primary.user is not None:  # the server's user writes its data, socket and log there
        shutil.chown(home, primary.user)
        shutil.chown(pgdata, primary.user)
    standby = Standby(home, socket_dir_for(pgdata), primary.user)
    started = time.perf_counter()
    try:
        # -c fast: the primary checkpoints at once instead of spreading it; --no-sync: a test's copy.
        _run([str(bin_dir() / "pg_basebackup"), "-D", str(pgdata), "-h", str(primary.socket_dir), "-U", "postgres",
              "-X", "stream", "-R", "-c", "fast", "--no-sync"], primary.user)
        for copied in pgdata.glob(".s.PGSQL.*"):  # the primary's socket lock, when its socket is in its data
            copied.unlink()
        own = primary.options | {"listen_addresses": "", "unix_socket_directories": str(standby.socket_dir),
                                 "hot_standby": "on"}
        with open(pgdata / "postgresql.auto.conf", "a") as conf:  # after primary_conninfo, which -R wrote
            conf.writelines(f"{name} = {_quoted(value)}\n" for name, value in own.items())
        _run([str(bin_dir() / "pg_ctl"), "start", "-D", str(pgdata), "-l", str(standby.log_file), "-w",
              "-t", str(int(timeout_s))], primary.user)
    except BaseException as exc:
        tail = standby.log_file.read_text(errors="replace")[-2000:] if standby.log_file.exists() else ""
        standby.stop()
        if tail and isinstance(exc, ServiceError):
            raise ServiceError(f"{exc}\n--- the standby's log ---\n{tail}") from exc
        raise
    log.info("standby of %s in %s, up in %.1fs", primary.pgdata, pgdata, time.perf_counter() - started)
    return standby


def wait_replayed(primary_uri: str, standby_uri: str, *, timeout_s: float = 60.0) -> None:
    """Wait until the standby has replayed everything the primary had written when this was called."""
    with psycopg.connect(primary_uri, autocommit=True) as conn:
        target = str(_value(conn, "SELECT pg_current_wal_lsn()"))
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(standby_uri, autocommit=True) as conn:
        while not _value(conn, _REPLAYED, (target,)):
            if time.monotonic() > deadline:
                raise ServiceError(f"the standby did not replay up to {target} within {timeout_s:g}s")
            time.sleep(0.05)
