"""python -m bench.train_ranker's fit: the same bytes on every run over the same rows, and what it learns."""

from __future__ import annotations

import json

import numpy as np

from bench.train_ranker import Example, fit, ranker_text
from epistream.consumers.retrieval import FEATURES, LinearRanker


def _examples(seed: int) -> list[Example]:
    generator = np.random.default_rng(seed)
    out = []
    for n in range(6):
        rows = generator.normal(size=(40, len(FEATURES)))
        labels = (rows[:, 0] + 0.5 * generator.normal(size=40) > 1.0).astype(float)
        labels[0] = 1.0
        out.append(Example(f"q{n}", "conv", 1, 1000, rows, labels))
    return out


def test_the_trainer_writes_the_same_bytes_twice_and_learns_the_signal():
    first, second = ranker_text(fit(_examples(7))), ranker_text(fit(_examples(7)))
    assert first == second
    model = json.loads(first)
    assert model["coefficients"][0] == max(model["coefficients"]) > 0
    loaded = LinearRanker.from_json(model)
    assert loaded.coefficients[0] == model["coefficients"][0]
    without = json.loads(ranker_text(fit(_examples(7), without=["fused"])))
    assert without["coefficients"][0] == 0.0 and without["training"]["without"] == ["fused"]
