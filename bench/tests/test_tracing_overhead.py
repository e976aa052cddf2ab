"""The tracing-overhead benchmark's own logic: the order of its phases, medians per kind of phase, and on against off."""

from __future__ import annotations

import pytest

from bench.tracing_overhead import draw_order, markdown, parse_args, summary


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


def test_each_round_runs_both_phases_in_an_order_drawn_from_the_seed():
    order = draw_order(40, seed=3)
    assert all(sorted(kinds) == ["off", "on"] for kinds in order)
    assert order == draw_order(40, seed=3)  # the seed is enough to know the order run
    assert {kinds[0] for kinds in order} == {"off", "on"}  # neither always first
    assert order != draw_order(40, seed=4)


def test_the_default_run_has_five_rounds_and_no_profile():
    args = parse_args([])
    assert (args.rounds, args.profile_s) == (5, 0.0)
    assert parse_args(["--seed", "9", "--profile-s", "3"]).seed == 9


def _read(tracing: bool, round_: int, caller_p50: float, worker_p50: float) -> dict:
    return {"tracing": tracing, "round": round_, "turns_per_s": 100.0, "context_p50_ms": caller_p50,
            "context_p95_ms": 2 * caller_p50, "worker_p50_ms": worker_p50, "worker_p95_ms": 2 * worker_p50}


def test_summary_has_the_worker_figures_beside_the_caller_ones_and_each_round_on_over_off():
    phases = [_read(True, 1, 60, 20), _read(False, 1, 50, 10), _read(False, 2, 40, 10), _read(True, 2, 44, 15),
              _read(True, 3, 66, 30), _read(False, 3, 60, 20)]
    s = summary(phases)
    assert s["context_p50_ms"] == {"off": 50.0, "on": 60.0, "on_over_off": 1.2, "rounds_on_over_off": [1.2, 1.1, 1.1]}
    assert s["worker_p50_ms"] == {"off": 10.0, "on": 20.0, "on_over_off": 2.0, "rounds_on_over_off": [2.0, 1.5, 1.5]}
    assert s["worker_p95_ms"]["on_over_off"] == 2.0
    table = markdown({"summary": s, "profile": {"on": {"tracing": 0.125, "the read (consumers/)": 0.5}}})
    assert "| read p50, caller (ms) | 50.0 | 60.0 | 1.2 | 1.10 to 1.20 |" in table
    assert "| read p50, worker (ms) | 10.0 | 20.0 | 2.0 | 1.50 to 2.00 |" in table
    assert "tracing on: 12.5% of py-spy's busy samples in tracing" in table


def test_an_older_runs_phases_without_worker_figures_still_sum_up():
    s = summary([_phase(False, 100, 40), _phase(True, 90, 44)])
    assert set(s) == {"turns_per_s", "context_p50_ms", "context_p95_ms"}
