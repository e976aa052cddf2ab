"""Stored vectors are re-embedded in place by the indexer's housekeeping, a batch at a time, across
tenants: turns stored before their embedding text changed (sql/011), and every vector another embedding
model made, after a switch of EPISTREAM_EMBEDDING_MODEL (sql/018). No read compares two models' vectors."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import psycopg
import pytest
from psycopg import sql

from epistream.consumers.retrieval.fragments import nearest
from epistream.consumers.retrieval.recipes import TurnRecipe
from epistream.consumers.retrieval.turns import search_turns
from epistream.contracts.turns import Turn
from epistream.core.metrics import Metrics
from epistream.models.embeddings import TURN_EMBEDDING_VERSION, Embedder, turn_embedding_text
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.reembed import pending, reembed_round
from epistream.storage.db import admin_database_url, create_pool, tenant_scope

from .helpers import T0

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def embedder(postgres) -> Embedder:
    return Embedder.from_settings(postgres)


def _turns(tenant: str, conversation: str) -> list[Turn]:
    said = ["I adopted a puppy named Oscar.", "We went hiking near Lisbon.", "My sister starts college in May."]
    return [Turn(tenant=tenant, conversation_id=conversation, turn_id=f"t{i}", speaker=("Ana", "Ben")[i % 2],
                 text=text, ts=T0 + timedelta(days=i)) for i, text in enumerate(said)]


def _rows(db_url: str, tenant: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT turn_id, embedded_as, embedding::text FROM memory.turns WHERE tenant = %s"
                            " ORDER BY turn_id", (tenant,)).fetchall()


def _vector(text: str) -> np.ndarray:
    return np.array([float(x) for x in text.strip("[]").split(",")], dtype=np.float32)


def _same(stored: str, expected: np.ndarray) -> bool:
    # The quantised models quantise activations per batch: the same text moves by < 0.01 cosine.
    return float(_vector(stored) @ expected) > 0.99


async def test_new_turns_embed_speaker_and_time_and_old_ones_are_reembedded_in_place(
        postgres, pool, db_url, unique, embedder):
    tenants = [unique("tenant-a"), unique("tenant-b")]
    turns = {tenant: _turns(tenant, unique("conv")) for tenant in tenants}
    for tenant_turns in turns.values():
        records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), int(time.time() * 1000))
                   for i, t in enumerate(tenant_turns)]
        await ingest_batch(records, pool=pool, embedder=embedder, metrics=Metrics.create())

    def expected(turn: Turn) -> np.ndarray:
        return embedder.embed([turn_embedding_text(turn.speaker, turn.text, turn.ts)])[0]

    for tenant in tenants:  # written the new way
        for (_, version, vector), turn in zip(_rows(db_url, tenant), turns[tenant], strict=True):
            assert version == TURN_EMBEDDING_VERSION
            assert _same(vector, expected(turn))

    with psycopg.connect(db_url) as conn:  # as a database migrated from before sql/011 holds them
        for tenant in tenants:
            for turn in turns[tenant]:
                conn.execute("UPDATE memory.turns SET embedding = %s::vector, embedded_as = 1 WHERE tenant = %s"
                             " AND turn_id = %s", (str(embedder.embed([turn.text])[0].tolist()), tenant, turn.turn_id))

    updated = 0
    while (n := await reembed_round(pool, embedder, limit=4)) > 0:  # small rounds: several conversations
        updated += n
    assert updated >= 6
    for tenant in tenants:
        for (_, version, vector), turn in zip(_rows(db_url, tenant), turns[tenant], strict=True):
            assert version == TURN_EMBEDDING_VERSION
            assert _same(vector, expected(turn))
    assert await reembed_round(pool, embedder) == 0


async def _nearest_turn_ids(pool, tenant: str, vector: np.ndarray) -> set[str]:
    """Every turn a dense read can reach (the one SQL fragment all dense reads use)."""
    query = nearest("turns", "t", sql.SQL("t.turn_id"), sql.SQL("t.tenant = %(tenant)s"))
    async with pool.connection() as conn, tenant_scope(conn, tenant):
        cur = await conn.execute(query, {"tenant": tenant, "vector": vector, "limit": 1000})
        return {row[0] for row in await cur.fetchall()}


async def test_switching_the_embedding_model_reembeds_every_vector_and_no_read_mixes_models(postgres, unique):
    minilm = postgres.with_overrides(embedding_model="all-minilm-l6-v2-int8")
    assert postgres.embedding_model == "e5-small-v2-q"
    old, new = Embedder.from_settings(minilm), Embedder.from_settings(postgres)
    tenant, conversation = unique("switch"), unique("conv")
    said = [f"Note {i}: the {('red', 'blue', 'green')[i % 3]} kayak trip number {i} went fine." for i in range(20)]
    said[7] = "My grandmother's violin was restored in Cremona last winter."
    turns = [Turn(tenant=tenant, conversation_id=conversation, turn_id=f"t{i:02d}", speaker="Ana", text=text,
                  ts=T0 + timedelta(hours=i)) for i, text in enumerate(said)]
    records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), None) for i, t in enumerate(turns)]
    new_pool = create_pool(postgres)
    await new_pool.open(wait=True)
    while await reembed_round(new_pool, new, budget_s=60.0) > 0:  # other tests' rows: this test's alone pend
        pass
    old_pool = create_pool(minilm)
    await old_pool.open(wait=True)
    try:  # a memory built by the MiniLM worker
        await ingest_batch(records, pool=old_pool, embedder=old, metrics=Metrics.create())
        async with old_pool.connection() as conn, tenant_scope(conn, tenant):
            await conn.execute("INSERT INTO memory.entities (tenant, entity_id, name, normalized_name, embedding,"
                               " first_seen) VALUES (%s, 'e0', 'Cremona', 'cremona', %s, %s)",
                               (tenant, old.embed(["Cremona"])[0], turns[7].ts))
    finally:
        await old_pool.close()

    try:
        question = new.embed_query("Where was the violin restored?")
        assert await _nearest_turn_ids(new_pool, tenant, question) == set()  # MiniLM's vectors: never compared
        async with new_pool.connection() as conn, tenant_scope(conn, tenant):  # ... but found lexically
            found = await search_turns(conn, tenant=tenant, query="Where was the violin restored?", vector=question,
                                       conversation_ids=[conversation], recipe=TurnRecipe())
        assert found and found[0].turn_id == "t07"
        left = await pending(new_pool, new.name)
        assert left[("turns", tenant)] == 20 and left[("entities", tenant)] == 1

        metrics = Metrics.create()
        # A batch at a time, by kind: the entity, then 8 turns.
        assert [await reembed_round(new_pool, new, limit=8, metrics=metrics) for _ in range(2)] == [1, 8]
        assert len(await _nearest_turn_ids(new_pool, tenant, question)) == 8
        assert metrics.reembed_pending.labels("turns")._value.get() >= 20
        started = time.perf_counter()
        while await reembed_round(new_pool, new, limit=8, budget_s=10.0, metrics=metrics) > 0:
            pass
        rate = 12 / (time.perf_counter() - started)
        assert await pending(new_pool, new.name) == {}
        assert metrics.reembed_pending.labels("turns")._value.get() == 0
        assert await _nearest_turn_ids(new_pool, tenant, question) == {t.turn_id for t in turns}
        with psycopg.connect(admin_database_url(postgres)) as conn:
            kinds = conn.execute("SELECT embedded_by, count(*) FROM memory.turns WHERE tenant = %s GROUP BY 1"
                                 " UNION ALL SELECT embedded_by, count(*) FROM memory.entities WHERE tenant = %s GROUP BY 1",
                                 (tenant, tenant)).fetchall()
        assert kinds == [("e5-small-v2-q", 20), ("e5-small-v2-q", 1)], rate
    finally:
        await new_pool.close()
