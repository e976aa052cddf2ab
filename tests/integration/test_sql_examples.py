"""Every example in sql/examples runs through psql against seeded memory and returns rows,
so none of them can rot."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from epistream.infra.postgres_server import psql_binary
from epistream.storage.db import reader_url

from .seed import seed_memory

pytestmark = pytest.mark.integration

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "sql" / "examples").glob("*.sql"))


@pytest.fixture(scope="module")
def seeded(postgres, unique_module):
    tenant, conversation = unique_module("tenant"), unique_module("conv")
    seed_memory(postgres, tenant, conversation)
    return tenant, conversation


@pytest.fixture(scope="module")
def unique_module():
    import uuid

    run = uuid.uuid4().hex[:8]
    return lambda name: f"{name}-{run}"


def test_there_are_examples_in_sql_and_cypher():
    assert len(EXAMPLES) >= 5
    assert any("cypher(" in path.read_text() for path in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_and_returns_rows(example, seeded, postgres):
    """As `epistream sql --tenant` runs them: the read-only login, scoped to the tenant."""
    tenant, conversation = seeded
    variables = {
        "tenant": tenant, "conversation": conversation, "subject": "Alice", "query": "Lisbon",
        "params": json.dumps({"tenant": tenant, "name": "Alice" if "facts_about" in example.name else "Bob"}),
    }
    args = [psql_binary(), reader_url(postgres, tenant), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-f", str(example)]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.strip()]
    assert rows, f"{example.name} returned no rows"
