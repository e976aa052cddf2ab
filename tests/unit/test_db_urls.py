"""The connection strings people's tools log in with, built without a database (pure logic): the
reader never borrows the workers' password, and a password can be split off a URL for PGPASSWORD."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

from epistream.settings.processes import Settings
from epistream.storage.db import READER_ROLE, reader_url, split_password, tenant_option

WORKERS = "postgresql://epistream_worker:w0rker%20pw@db.example:5432/epistream?sslmode=require"


def _reader(**overrides: object) -> dict[str, str]:
    settings = Settings().with_overrides(**{"database_url": SecretStr(WORKERS), "db_reader_password": None, **overrides})
    return conninfo_to_dict(reader_url(settings, "acme corp"))  # type: ignore[return-value]


def test_without_a_reader_password_the_reader_url_has_none_not_the_workers():
    params = _reader()
    assert "password" not in params  # libpq then reads PGPASSWORD, PGPASSFILE or ~/.pgpass
    assert params == {"user": READER_ROLE, "host": "db.example", "port": "5432", "dbname": "epistream",
                      "sslmode": "require", "options": tenant_option("acme corp")}


def test_the_reader_password_is_the_readers_own():
    assert _reader(db_reader_password=SecretStr("r3ader"))["password"] == "r3ader"
    assert "password" not in _reader(db_reader_password=SecretStr(""))  # empty: as unset


def test_split_password_keeps_everything_but_the_password():
    url, password = split_password("host=db user=u password='a b\\'c' dbname=e options='-c x=1'")
    assert password == "a b'c"
    assert conninfo_to_dict(url) == {"host": "db", "user": "u", "dbname": "e", "options": "-c x=1"}
    url, password = split_password(WORKERS)
    assert password == "w0rker pw" and "w0rker" not in url
    assert conninfo_to_dict(url)["user"] == "epistream_worker"


def test_split_password_of_a_url_without_one_is_that_url_and_none():
    assert split_password("host=/tmp/sock dbname=e")[1] is None
    assert split_password("postgresql://postgres:@/e?host=/tmp/sock") == ("user=postgres dbname=e host=/tmp/sock", None)


def test_psql_gets_the_password_in_its_environment_not_on_its_command_line(monkeypatch):
    import epistream.infra.postgres_server
    from epistream.apps.cli import main as cli

    monkeypatch.setenv("EPISTREAM_DATABASE_URL", WORKERS)
    monkeypatch.setenv("EPISTREAM_DATABASE_ADMIN_URL", "postgresql://owner:0wner%20pw@db.example/epistream")
    monkeypatch.delenv("EPISTREAM_DB_READER_PASSWORD", raising=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setattr(epistream.infra.postgres_server, "psql_binary", lambda: "/bin/psql")
    runs: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(cli.os, "execve", lambda path, argv, env: runs.append((argv, env)))

    cli.cmd_sql(cli.sql_arguments(["--admin", "-c", "select 1"]))
    cli.cmd_sql(cli.sql_arguments(["--tenant", "acme"]))
    (admin_argv, admin_env), (reader_argv, reader_env) = runs
    assert admin_env["PGPASSWORD"] == "0wner pw" and not any("0wner" in arg for arg in admin_argv)
    assert conninfo_to_dict(admin_argv[1])["user"] == "owner" and admin_argv[2:] == ["-c", "select 1"]
    assert "PGPASSWORD" not in reader_env and not any("w0rker" in arg for arg in reader_argv)


def test_a_worker_login_on_another_database_never_keeps_the_owners_password():
    from epistream.storage.db import on_database

    admin = "postgresql://owner:owner-secret@db.example:5432/bench"
    worker = on_database(Settings(database_url="postgresql://x@h/d"), admin).database_url.get_secret_value()
    assert "owner-secret" not in worker and "user=epistream_worker" in worker
    with_password = on_database(Settings(database_url="postgresql://x@h/d", db_worker_password="w-pw"), admin)
    assert "password=w-pw" in with_password.database_url.get_secret_value()
