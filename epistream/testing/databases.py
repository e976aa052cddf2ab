"""Databases of their own on the running PostgreSQL: one for a test tier, a deployment, a benchmark run;
created and migrated, and dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url, apply_migrations


def own_database(settings: Settings, name: str) -> str:
    """A fresh, migrated database on the settings' server: one deployment, one memory; its URL."""
    base = admin_database_url(settings)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(base, dbname=name)
    apply_migrations(url)
    return url


def drop_database(settings: Settings, name: str) -> None:
    with psycopg.connect(admin_database_url(settings), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@contextmanager
def scratch_database(settings: Settings, prefix: str, *, keep: bool = False) -> Iterator[str]:
    """The URL of a fresh, migrated database named `prefix` + a random suffix, dropped after unless kept."""
    name = unique_name(prefix)
    print(f"database {name}", flush=True)
    try:
        yield own_database(settings, name)
    finally:
        if not keep:
            drop_database(settings, name)
