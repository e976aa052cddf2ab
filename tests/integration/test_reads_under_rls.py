"""Reads as the application role, under its tenant policy, still probe their indexes.

PostgreSQL applies a row-level-security policy before any condition of the query that is not
LEAKPROOF. Two reads lost their index that way, and so read every turn of the tenant (the cost grew
with the memory: bench.scale): full-text matching (tsvector @@ tsquery, marked leakproof by migration
013), and the fused turn search's join back to its turns on ``coalesce(...)`` expressions (now on
the plain columns of a materialised CTE). Index scans are forced where the planner may choose one, so
the tests ask whether the index *can* be used, not whether a tiny table makes it worth it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from psycopg import sql

from consumers.retrieval import FUSED_TURNS
from consumers.retrieval.fragments import conversations
from consumers.retrieval.turns import fused_turn_search
from epistream.db import tenant_scope

pytestmark = pytest.mark.integration


def _indexes(plan: dict) -> set[str]:
    found = {plan["Index Name"]} if "Index Name" in plan else set()
    for child in plan.get("Plans", []):
        found |= _indexes(child)
    return found


async def _plan_indexes(conn, statement: sql.Composable, params: dict) -> set[str]:  # type: ignore[no-untyped-def]
    await conn.execute("SET LOCAL enable_seqscan = off")
    cursor = await conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + statement, params)
    plan = (await cursor.fetchone())[0]
    return _indexes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])


async def test_full_text_matching_may_run_before_the_tenant_policy(postgres, pool, unique):
    """Only a leakproof condition may use an index ahead of the policy; which index the planner then
    picks depends on the table's size (bench.scale reads it at each size)."""
    async with pool.connection() as conn:
        cursor = await conn.execute("SELECT proleakproof FROM pg_proc"
                                    " WHERE oid = 'pg_catalog.ts_match_vq(tsvector, tsquery)'::regprocedure")
        assert (await cursor.fetchone())[0] is True


async def test_the_fused_turn_search_joins_back_to_its_turns_by_primary_key(postgres, pool, unique):
    tenant, conversation = unique("rls"), unique("conv")
    params = {"tenant": tenant, "query": "volcano", "vector": np.zeros(384, dtype=np.float32) + 0.05,
              "conversations": conversations([conversation]), "top_k": 8, "pool": 50, "rrf_k": 30,
              "use_dense": True, "use_lexical": True, "match_cap": FUSED_TURNS.match_cap, "start": None,
              "end": None, "speakers": [], "speaker_bonus": 0.0}
    async with pool.connection() as conn, conn.transaction(), tenant_scope(conn, tenant):
        used = await _plan_indexes(conn, fused_turn_search("simple"), params)
    assert "turns_pkey" in used
