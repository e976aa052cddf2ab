"""Reads as the application role, under its tenant policy, may still use their full-text index.

PostgreSQL applies a row-level-security policy before any condition of the query that is not
LEAKPROOF, so full-text matching (tsvector @@ tsquery) could not use its GIN index and every lexical
read scanned all the tenant's turns in scope (the cost grew with the memory: bench.scale). Migration
013 marks it leakproof. Which index the planner then picks depends on the table's size, so the test
asserts the precondition, not a plan; bench.scale measures the reads themselves.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


async def test_full_text_matching_may_run_before_the_tenant_policy(postgres, pool, unique):
    """Only a leakproof condition may use an index ahead of the policy; which index the planner then
    picks depends on the table's size (bench.scale reads it at each size)."""
    async with pool.connection() as conn:
        cursor = await conn.execute("SELECT proleakproof FROM pg_proc"
                                    " WHERE oid = 'pg_catalog.ts_match_vq(tsvector, tsquery)'::regprocedure")
        assert (await cursor.fetchone())[0] is True

