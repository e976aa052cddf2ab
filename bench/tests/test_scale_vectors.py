"""The scale benchmark's vector store: chunks written once, resumed after an interruption, and never
mixed with vectors of another workload."""

from __future__ import annotations

import numpy as np
import pytest

from bench.scale.vectors import VectorStore, embed_missing
from bench.workload_scale import WorkloadSpec, turns

SPEC = WorkloadSpec(tenants=1, conversations_per_tenant=2, sessions_per_conversation=2, turns_per_session=6)


class CountingEmbedder:
    """Stands in for the ONNX model (pure logic here): a vector per text, and how many it was given."""

    def __init__(self) -> None:
        self.texts = 0

    def embed(self, texts):
        self.texts += len(texts)
        return np.array([[len(t), hash(t) % 97] + [0.0] * 382 for t in texts], dtype=np.float32)


def test_an_interrupted_run_embeds_only_the_missing_chunks(tmp_path):
    store = VectorStore(tmp_path, SPEC, chunk=10)
    first = CountingEmbedder()
    embed_missing(store, first, upto=20)  # the first two chunks, then "interrupted"
    assert first.texts == 20 and store.ready(20) and not store.ready(SPEC.turns)
    again = CountingEmbedder()
    embed_missing(VectorStore(tmp_path, SPEC, chunk=10), again, upto=SPEC.turns)
    assert again.texts == SPEC.turns - 20
    loaded = [(t.turn_id, v[0]) for chunk, vectors in store.chunked() for t, v in zip(chunk, vectors, strict=True)]
    assert [turn_id for turn_id, _ in loaded] == [t.turn_id for t in turns(SPEC)]


def test_the_stream_of_chunks_stops_at_the_first_missing_one(tmp_path):
    store = VectorStore(tmp_path, SPEC, chunk=10)
    embed_missing(store, CountingEmbedder(), upto=10)
    assert sum(len(chunk) for chunk, _ in store.chunked()) == 10


def test_vectors_of_another_workload_are_refused(tmp_path):
    VectorStore(tmp_path, SPEC, chunk=10)
    with pytest.raises(SystemExit, match="another workload"):
        VectorStore(tmp_path, WorkloadSpec(tenants=1, conversations_per_tenant=2, sessions_per_conversation=2,
                                           turns_per_session=6, seed=14), chunk=10)
