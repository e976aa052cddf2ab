"""Turns are embedded with who said them and when; turns stored before that (sql/011) are re-embedded
in place by the indexer's housekeeping, a batch at a time, across tenants."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import psycopg
import pytest

from epistream.contracts import Turn
from epistream.embeddings import TURN_EMBEDDING_VERSION, Embedder, turn_embedding_text
from epistream.metrics import Metrics
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.reembed import reembed_round

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
            assert np.allclose(_vector(vector), expected(turn), atol=1e-5)

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
            assert np.allclose(_vector(vector), expected(turn), atol=1e-5)
    assert await reembed_round(pool, embedder) == 0
