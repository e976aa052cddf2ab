"""Tenant isolation enforced by PostgreSQL (row-level security on every table,
view and graph label), through the answer consumer too; and forgetting that
leaves nothing behind and survives a replay."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import psycopg
import pytest

from epistream.client.api import ask
from epistream.contracts.questions import Mode, Question
from epistream.pipeline.store.forget import forget
from epistream.pipeline.store.graph import _statement
from epistream.storage.db import create_pool, tenant_scope

from .conftest import count_turns, wait_for
from .helpers import make_turns, produce_turns
from .seed import seed_memory

pytestmark = pytest.mark.integration

TABLES = ["turns", "segments", "segmenter_state", "gists", "entities", "gist_mentions", "facts", "term_counts",
          "tombstones"]
VIEWS = ["gist_timeline", "fact_history", "segment_summaries", "conversation_stats", "current_facts"]
GRAPH_COUNT = _statement("MATCH (n) OPTIONAL MATCH (n)-[r]->() RETURN count(DISTINCT n), count(r)",
                         "n agtype, r agtype")


@pytest.fixture(scope="module")
def two_tenants(stack):
    run = uuid.uuid4().hex[:8]
    a, b = f"tenant-a-{run}", f"tenant-b-{run}"
    seed_memory(stack, a, f"conv-a-{run}")
    seed_memory(stack, b, f"conv-b-{run}")
    return a, b, f"conv-a-{run}", f"conv-b-{run}"


def _as_app(stack, tenant: str | None, work):
    """Run `work(conn)` as the workers do: role epistream_app, scoped to `tenant`."""
    async def go():
        pool = create_pool(stack)
        await pool.open(wait=True)
        try:
            async with pool.connection() as conn:
                if tenant is None:
                    async with conn.transaction():
                        return await work(conn)
                async with tenant_scope(conn, tenant):
                    return await work(conn)
        finally:
            await pool.close()
    return asyncio.run(go())


async def _tenants_visible(conn) -> dict[str, set[str]]:
    seen = {}
    for relation in TABLES + VIEWS:
        cur = await conn.execute(f"SELECT DISTINCT tenant FROM memory.{relation}")
        seen[relation] = {r[0] for r in await cur.fetchall()}
    cur = await conn.execute(_statement("MATCH (n) RETURN DISTINCT n.tenant", "t agtype"), ("{}",))
    seen["graph"] = {json.loads(r[0]) for r in await cur.fetchall()}
    return seen


def test_a_tenant_sees_only_its_own_rows_in_every_table_view_and_graph_label(stack, two_tenants):
    a, b, _, _ = two_tenants
    seen = _as_app(stack, a, _tenants_visible)
    for relation, tenants in seen.items():
        if relation == "tombstones":
            continue  # nothing forgotten yet
        assert tenants == {a}, f"{relation} shows {tenants}"
    # Without a tenant, nothing at all.
    assert all(not tenants for tenants in _as_app(stack, None, _tenants_visible).values())


def test_a_tenant_cannot_write_into_another_tenant(stack, two_tenants):
    a, b, _, conv_b = two_tenants

    async def write(conn):
        await conn.execute("UPDATE memory.gists SET text = 'overwritten' WHERE tenant = %s", (b,))
        cur = await conn.execute("SELECT count(*) FROM memory.gists WHERE text = 'overwritten'")
        updated = (await cur.fetchone())[0]
        try:
            async with conn.transaction():
                await conn.execute("INSERT INTO memory.tombstones (tenant, conversation_id) VALUES (%s, %s)",
                                   (b, conv_b))
        except psycopg.errors.InsufficientPrivilege as exc:
            return updated, str(exc)
        return updated, None

    updated, refused = _as_app(stack, a, write)
    assert updated == 0
    assert refused is not None and "row-level security" in refused


def test_the_answer_consumer_never_reads_another_tenants_memory(stack, two_tenants):
    a, b, _, conv_b = two_tenants
    question = Question(question_id=f"q-{uuid.uuid4()}", tenant=a, question="Where did Alice move to?",
                        conversation_ids=[conv_b], asked_at=datetime(2024, 4, 1, tzinfo=UTC), mode=Mode.FAST)
    answer = asyncio.run(ask(stack, question, timeout_s=240))
    assert answer.abstained and answer.evidence == []
    assert answer.tokens["master"].calls == 0, "nothing of tenant B may reach the model"


def _counts(db_url: str, tenant: str, conversation: str | None) -> dict[str, int]:
    counts = {}
    with psycopg.connect(db_url) as conn:
        for table in TABLES[:-1]:
            column = "conversation_id" if table not in ("entities", "gist_mentions") else None
            if conversation is not None and column is None:
                continue
            where = "tenant = %s" + (" AND conversation_id = %s" if conversation is not None else "")
            args = (tenant, conversation) if conversation is not None else (tenant,)
            counts[table] = conn.execute(f"SELECT count(*) FROM memory.{table} WHERE {where}", args).fetchone()[0]
        conn.execute("LOAD 'age'")
        conn.execute("SET search_path = ag_catalog, public")
        query = "MATCH (n {tenant: $tenant}) RETURN count(n)" if conversation is None else \
            "MATCH (n:Gist {tenant: $tenant, conversation_id: $conversation}) RETURN count(n)"
        counts["graph_vertices"] = int(conn.execute(_statement(query, "n agtype"), (json.dumps(
            {"tenant": tenant, "conversation": conversation}),)).fetchone()[0])
    return counts


def test_forgetting_a_conversation_leaves_nothing_and_a_replay_does_not_restore_it(stack, db_url, unique):
    tenant, gone, kept = unique("tenant"), unique("gone"), unique("kept")
    seed_memory(stack, tenant, gone)
    seed_memory(stack, tenant, kept)
    assert all(_counts(db_url, tenant, gone).values())
    kept_before = _counts(db_url, tenant, kept)

    done = _as_app(stack, tenant, lambda conn: forget(conn, tenant, gone))
    assert done.rows["turns"] == 5 and done.graph_elements > 0
    assert not any(_counts(db_url, tenant, gone).values())
    assert _counts(db_url, tenant, kept) == kept_before
    with psycopg.connect(db_url) as conn:
        facts_left = conn.execute("SELECT count(*) FROM memory.facts f WHERE f.tenant = %s AND f.segment_id LIKE %s",
                                  (tenant, f"{gone}#%")).fetchone()[0]
    assert facts_left == 0

    # Replay the forgotten turns through Kafka, then a sentinel on the same partition:
    # once the sentinel is stored, the replayed turns have been seen and skipped.
    turns = make_turns(tenant, gone, [("Alice", "I moved to Lisbon last Wednesday."), ("Bob", "Nice!")])
    sentinel = make_turns(tenant, unique("sentinel"), [("Alice", "sentinel")])[0]
    produce_turns(stack, turns)
    asyncio.run(_produce_keyed(stack, gone, sentinel))
    wait_for(lambda: count_turns(db_url, tenant, sentinel.conversation_id) == 1, what="sentinel stored")
    assert count_turns(db_url, tenant, gone) == 0


async def _produce_keyed(settings, key: str, turn) -> None:
    from epistream.client.api import produce_raw

    await produce_raw(settings, [(key.encode(), turn.to_bytes())])


def test_forgetting_a_whole_tenant_removes_every_row_and_graph_element(stack, db_url, unique):
    tenant = unique("tenant")
    seed_memory(stack, tenant, unique("c1"))
    seed_memory(stack, tenant, unique("c2"))
    done = _as_app(stack, tenant, lambda conn: forget(conn, tenant))
    assert done.rows["entities"] > 0
    assert not any(_counts(db_url, tenant, None).values())
