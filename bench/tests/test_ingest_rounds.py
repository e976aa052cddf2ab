"""The ingest benchmark's interleaved rounds: which round's figures are the headline, and the spread."""

from __future__ import annotations

from bench.ingest import IngestFigures, Timed
from bench.ingest_phase import Round, median_round, spread


def _round(turns_per_s: float, sentences_per_s: float) -> Round:
    ingest = IngestFigures(turns=1000, produce_s=0.1, wall_s=1000 / turns_per_s, db_span_s=1.0, latency_p50_s=1.0,
                           latency_p95_s=2.0, latency_max_s=3.0, worker=None, worker_cpu_s=None)
    return Round(ingest, Timed(1000, 1000 / sentences_per_s))


def test_the_headline_is_the_round_with_the_median_ratio_and_the_spread_covers_every_round():
    rounds = [_round(100, 150), _round(120, 85), _round(110, 120)]  # ratios 0.67, 1.41, 0.92
    assert median_round(rounds) is rounds[2]
    ratio = spread(rounds)["ingest_over_embedding"]
    assert (ratio["min"], ratio["median"], ratio["max"]) == (0.6667, 0.9167, 1.4118)
    assert spread(rounds)["embedding_sentences_per_s"] == {"min": 85.0, "median": 120.0, "max": 150.0}


def test_an_even_count_takes_the_lower_middle_and_one_round_is_its_own_median():
    rounds = [_round(100, 100), _round(90, 100), _round(80, 100), _round(70, 100)]
    assert median_round(rounds) is rounds[2]
    assert median_round(rounds[:1]) is rounds[0]
    assert rounds[0].summary()["ingest_over_embedding"] == 1.0
