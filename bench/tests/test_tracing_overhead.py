"""The tracing-overhead benchmark's own logic: medians per kind of phase, and on against off."""

from __future__ import annotations

import pytest

from bench.tracing_overhead import markdown, parse_args, summary


def _phase(tracing: bool, turns_per_s: float, p95: float) -> dict:
    return {"tracing": tracing, "turns_per_s": turns_per_s, "context_p50_ms": p95 / 2, "context_p95_ms": p95}


def test_summary_is_the_median_of_each_kind_of_phase_and_their_ratio():
    phases = [_phase(False, 100, 40), _phase(True, 90, 44), _phase(False, 110, 60), _phase(True, 80, 50),
              _phase(False, 120, 50), _phase(True, 99, 55)]
    s = summary(phases)
    assert s["turns_per_s"] == {"off": 110.0, "on": 90.0, "on_over_off": round(90 / 110, 3)}
    assert s["context_p95_ms"] == {"off": 50.0, "on": 50.0, "on_over_off": 1.0}
    assert "| ingest turns/s | 110.0 | 90.0 | 0.818 |" in markdown({"summary": s})


def test_every_phase_needs_at_least_one_turn_read_and_round():
    assert parse_args(["--turns", "5", "--reads", "2", "--rounds", "1"]).turns == 5
    for bad in (["--turns", "0"], ["--reads", "0"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
