"""A database of its own for one benchmark run: created on the running PostgreSQL (the embedded one
started first when asked), migrated, and dropped afterwards unless kept."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from epistream.db import admin_database_url, apply_migrations
from epistream.settings import Settings


@contextmanager
def scratch_database(settings: Settings, prefix: str, *, start_postgres: bool = False,
                     keep: bool = False) -> Iterator[str]:
    """Yield the URL of a fresh, migrated database named `prefix` + a random suffix."""
    if start_postgres:
        from epistream.infra import services
        services.up(settings, workers=False, only={"postgres"})
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    base = admin_database_url(settings)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    print(f"database {name}", flush=True)
    try:
        url = make_conninfo(base, dbname=name)
        apply_migrations(url)
        yield url
    finally:
        if not keep:
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
