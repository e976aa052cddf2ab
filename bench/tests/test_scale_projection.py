"""The scale curve's projection: a power law through the two largest measured sizes."""

from __future__ import annotations

import pytest

from bench.scale.plot import extend, project


def test_a_power_law_is_extended_along_its_own_slope():
    value, slope = extend(1e5, 20.0, 1e6, 40.0, 1e7)
    assert slope == pytest.approx(0.30103, rel=1e-4) and value == pytest.approx(80.0)
    assert extend(1e5, 5.0, 1e6, 5.0, 1e7) == (pytest.approx(5.0), 0.0)


def test_the_projection_uses_the_two_largest_sizes_whatever_their_order():
    def point(turns: int, ms: float, size: float) -> dict:
        return {"turns": turns, "reads": {"case": {"p50_ms": ms, "p95_ms": 2 * ms}}, "disk": {"bytes_per_turn": size}}

    report = {"points": [point(1_000_000, 40.0, 4000.0), point(10_000, 1.0, 9000.0), point(100_000, 20.0, 5000.0)]}
    projected = project(report, 10_000_000)
    assert projected["from_turns"] == [100_000, 1_000_000]
    assert projected["reads"]["case"]["p50_ms"]["value"] == pytest.approx(80.0)
    assert projected["reads"]["case"]["p95_ms"]["value"] == pytest.approx(160.0)
    assert projected["bytes_per_turn"]["value"] == pytest.approx(3200.0)
    assert projected["disk_gb"] == pytest.approx(32.0)
