from __future__ import annotations

from datetime import UTC, datetime, timedelta

from epistream.models.prompts import estimate_tokens
from epistream.pipeline.segmenter import SegmenterConfig, SegmenterState, close, feed

T0 = datetime(2024, 1, 1, 10, 0, tzinfo=UTC)
CONFIG = SegmenterConfig(max_tokens=100, overlap_share=0.25, max_gap=timedelta(hours=1))


def run(turns, config=CONFIG, state=None):
    state = state or SegmenterState()
    closed = []
    for i, (tokens, minutes, session) in enumerate(turns):
        step = feed(state, turn_id=f"t{i}", tokens=tokens, ts=T0 + timedelta(minutes=minutes), session_id=session,
                    config=config)
        state = step.state
        closed.extend(step.closed)
    return state, closed


def test_budget_closes_and_carries_an_overlap_within_its_share():
    state, closed = run([(30, 0, "s1"), (30, 1, "s1"), (20, 2, "s1"), (20, 3, "s1")])
    assert len(closed) == 1
    seg = closed[0]
    assert seg.reason == "budget" and seg.turn_ids == ("t0", "t1", "t2", "t3") and seg.token_estimate == 100
    assert seg.overlap_turns == 0
    # 25% of 100 tokens: only the last 20-token turn fits.
    assert [t.turn_id for t in state.open] == ["t3"] and state.carried == 1


def test_the_next_segment_starts_with_the_overlap_and_reports_it():
    _, closed = run([(30, 0, "s1"), (30, 1, "s1"), (20, 2, "s1"), (20, 3, "s1"), (50, 4, "s1"), (40, 5, "s1")])
    assert [c.turn_ids for c in closed] == [("t0", "t1", "t2", "t3"), ("t3", "t4", "t5")]
    assert closed[1].overlap_turns == 1


def test_session_change_closes_without_overlap():
    state, closed = run([(10, 0, "s1"), (10, 1, "s1"), (10, 2, "s2")])
    assert [(c.reason, c.turn_ids) for c in closed] == [("session", ("t0", "t1"))]
    assert [t.turn_id for t in state.open] == ["t2"] and state.carried == 0


def test_long_gap_closes_without_overlap():
    _, closed = run([(10, 0, None), (10, 1, None), (10, 120, None)])
    assert [(c.reason, c.turn_ids) for c in closed] == [("gap", ("t0", "t1"))]


def test_idle_close_carries_overlap_and_is_a_no_op_when_nothing_is_new():
    state, _ = run([(10, 0, "s1"), (10, 1, "s1")])
    step = close(state, "idle", CONFIG)
    assert [(c.reason, c.turn_ids) for c in step.closed] == [("idle", ("t0", "t1"))]
    assert step.state.carried == 1 and step.state.next_seq == 1
    again = close(step.state, "idle", CONFIG)
    assert again.closed == [] and again.state == step.state


def test_a_turn_larger_than_the_budget_is_a_segment_of_its_own():
    _, closed = run([(10, 0, "s1"), (500, 1, "s1")])
    assert [c.turn_ids for c in closed] == [("t0", "t1")]
    _, closed = run([(500, 0, "s1")])
    assert [c.turn_ids for c in closed] == [("t0",)]


def test_session_boundary_after_an_overlap_drops_the_carried_turns():
    _, closed = run([(60, 0, "s1"), (20, 1, "s1"), (20, 2, "s1"), (10, 3, "s2")])
    # budget close at t2 carries t2; the session change must not re-emit it alone.
    assert [c.turn_ids for c in closed] == [("t0", "t1", "t2")]


def test_sequence_numbers_and_replay_are_deterministic():
    turns = [(35, i, f"s{i // 7}") for i in range(30)]
    _, first = run(turns)
    _, second = run(turns)
    assert first == second
    assert [c.seq for c in first] == list(range(len(first)))


def test_estimate_tokens():
    assert estimate_tokens("") == 1 and estimate_tokens("abcd" * 10) == 10
