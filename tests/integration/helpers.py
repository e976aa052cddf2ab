"""Small builders shared by the integration tests."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import numpy as np

from epistream.client.api import produce_raw
from epistream.contracts.turns import Turn
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.settings.processes import Settings
from epistream.storage.db import create_pool
from epistream.testing.turns import T0, make_turns  # noqa: F401 (the integration tests take them from here)


def produce_turns(settings: Settings, turns: list[Turn]) -> int:
    return asyncio.run(produce_raw(settings, [(t.conversation_id.encode(), t.to_bytes()) for t in turns]))


def store_turns(settings: Settings, embedder: Embedder, turns: list[Turn]) -> None:
    """Store turns as the ingest worker does (its ingest_batch), without Kafka."""
    async def go() -> None:
        pool = create_pool(settings)
        await pool.open(wait=True)
        try:
            await ingest_batch([RawRecord("memory.turns", 0, n, None, t.to_bytes(), None) for n, t in enumerate(turns)],
                               pool=pool, embedder=embedder, metrics=Metrics.create(), segmenter=SegmenterConfig())
        finally:
            await pool.close()
    asyncio.run(go())


def produce_bytes(settings: Settings, records: list[tuple[bytes | None, bytes]], *, topic: str | None = None) -> int:
    return asyncio.run(produce_raw(settings, records, topic=topic))


#: A segmenter that closes on nothing the ingest tests send but their own close requests.
LONG_SEGMENTS = SegmenterConfig(max_tokens=10_000, overlap_share=0.0, max_gap=timedelta(hours=1))
POISON = "POISON-FOR-THE-EMBEDDER"


class PickyEmbedder:
    """The real embedder, except that it raises on one marked text (an error no contract catches)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    def embed(self, texts: list[str]) -> np.ndarray:
        if any(POISON in t for t in texts):
            raise ValueError("the tokenizer choked")
        return self.inner.embed(texts)
