"""The equal-budget eval's stored memory (PostgreSQL tier): conversations written by the ingest
worker's own batch function, and the dense turn search over them in exact cosine order under the
tenant and conversation filter, every turn of the conversation found, even with another tenant's
turns nearer the query (issue 12, part 6: the eval's dense baseline is the exact MiniLM ranking).

At this size (and at LoCoMo's) PostgreSQL plans the filtered search on the primary key and sorts,
so the HNSW index's own recall is not what this checks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import numpy as np
import pytest

from bench.budget_systems import CachedEmbedder, Memory, Query, RouterSegments, StoredTurns
from epistream.consumers.retrieval import from_settings
from epistream.models.embeddings import turn_embedding_text
from epistream.settings.processes import Settings
from epistream.testing.turns import make_turns

pytestmark = pytest.mark.integration


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.normal(size=(n, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_dense_turn_search_is_exact_under_a_tenant_filter_and_the_router_reads_whole_segments(
        postgres: Settings, unique) -> None:
    rng = np.random.default_rng(12)
    tenant, stranger = unique("budget"), unique("crowd")
    ours = make_turns(tenant, unique("conv"), [("Ann" if i % 2 else "Bo", f"our turn number {i}") for i in range(120)])
    theirs = make_turns(stranger, unique("conv"), [("Cy", f"their turn number {i}") for i in range(1500)])
    query = unit(rng, 1)[0]
    our_vectors = unit(rng, len(ours))
    # The stranger's turns all lie closer to the query than any of ours: a search that leaked across
    # tenants, or took its neighbours before filtering, would return fewer or other turns.
    their_vectors = query + 0.05 * unit(rng, len(theirs))
    their_vectors /= np.linalg.norm(their_vectors, axis=1, keepdims=True)
    embedder = CachedEmbedder([turn_embedding_text(t.speaker, t.text, t.ts) for t in ours + theirs],
                              np.vstack([our_vectors, their_vectors]))

    async def scenario() -> tuple[list[str], list[str], int]:
        memory = await Memory.create(postgres, tenant)
        try:
            assert await memory.store(ours, embedder) == len(ours)
            crowd = Memory(postgres, memory.name, memory.pool, stranger)
            assert await crowd.store(theirs, embedder) == len(theirs)
            recipes = from_settings(postgres)
            q = Query("k", "s", ours[0].conversation_id, "number", 1, ("t001",), datetime.now(UTC), query)
            dense = await StoredTurns("dense_turns", memory, recipes, dense_only=True).pieces(q, 4000)
            routed = await RouterSegments(memory, recipes, {(t.conversation_id, t.turn_id): t for t in ours}
                                          ).pieces(q, 4000)
            return [p.turn_ids[0] for p in dense], [p.turn_ids[0] for p in routed], await memory.count("segments")
        finally:
            await memory.drop()

    dense, routed, segments = asyncio.run(scenario())
    exact = [ours[i].turn_id for i in np.argsort(-(our_vectors @ query), kind="stable")]
    assert dense == exact[:len(dense)] and len(dense) == len(ours)  # every turn, in exact cosine order
    assert segments > 1  # the test tier's 400-token segments: the last one closed by the idle-close record
    assert set(routed) == {t.turn_id for t in ours}
