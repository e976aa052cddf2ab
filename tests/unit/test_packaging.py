"""What a wheel needs beside the code: the SQL migrations travel as package data, so an installed
(non-editable) epistream finds them without the source checkout."""

from __future__ import annotations

import tomllib
from pathlib import Path

from epistream.storage import db

ROOT = Path(__file__).resolve().parents[2]


def test_migrations_are_package_data_linked_to_the_top_level_sql():
    link = ROOT / "epistream" / "sql"
    assert link.is_symlink() and link.resolve() == (ROOT / "sql").resolve()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "sql/*.sql" in package_data["epistream"]


def test_migrations_are_read_through_the_package():
    names = [path.name for _, path in db.migration_files()]
    assert names == sorted(p.name for p in (ROOT / "sql").glob("[0-9][0-9][0-9]_*.sql"))
    assert Path(str(db.SQL_DIR)).resolve() == (ROOT / "sql").resolve()


def test_the_worker_image_imports_the_installed_wheel_only():
    dockerfile = (ROOT / "infra" / "deploy" / "Dockerfile").read_text()
    assert "PYTHONPATH" not in dockerfile
