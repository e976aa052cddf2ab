"""Small builders shared by the integration tests."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import numpy as np

from epistream.client import produce_raw
from epistream.contracts import Turn
from epistream.embeddings import Embedder
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.settings import Settings

T0 = datetime(2024, 5, 6, 9, 0, tzinfo=timezone(timedelta(hours=2)))


def make_turns(tenant: str, conversation_id: str, texts: list[tuple[str, str]], *, start: datetime = T0) -> list[Turn]:
    return [
        Turn(
            tenant=tenant, conversation_id=conversation_id, turn_id=f"t{i:03d}", speaker=speaker,
            text=text, ts=start + timedelta(minutes=i), session_id="session_1",
        )
        for i, (speaker, text) in enumerate(texts, start=1)
    ]


def produce_turns(settings: Settings, turns: list[Turn]) -> int:
    return asyncio.run(produce_raw(settings, [(t.conversation_id.encode(), t.to_bytes()) for t in turns]))


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
