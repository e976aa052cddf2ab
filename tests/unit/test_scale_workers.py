"""bench.scale.workers' pure logic: partition shares, loss and duplication against the log, takeover
times, exactly-once answers."""

from __future__ import annotations

import pytest

from bench.scale.workers_check import Row, Timed, account, answered, even_share, speedup_bound, takeover


def test_even_share_splits_partitions_largest_first() -> None:
    assert even_share(4, 1) == [4]
    assert even_share(4, 2) == [2, 2]
    assert even_share(4, 3) == [2, 1, 1]
    assert even_share(4, 5) == [1, 1, 1, 1, 0]  # the fifth member stays idle
    with pytest.raises(ValueError):
        even_share(4, 0)


def test_speedup_is_bounded_by_the_busiest_worker() -> None:
    assert [speedup_bound(4, n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 2.0, 4.0, 4.0]
    assert speedup_bound(6, 3) == 3.0
    assert speedup_bound(0, 2) == 0.0


def _log(*keys: tuple[str, int, int]) -> list[Row]:
    return [Row("c1", turn, partition, offset) for turn, partition, offset in keys]


def test_account_every_turn_stored_once_from_its_record() -> None:
    produced = _log(("t1", 0, 10), ("t2", 0, 11), ("t3", 1, 5))
    counts = account(produced, list(produced))
    assert (counts.produced, counts.records, counts.rows, counts.distinct) == (3, 3, 3, 3)
    assert (counts.lost, counts.duplicated, counts.provenance_mismatch) == (0, 0, 0)
    assert counts.ok and counts.as_json()["ok"] is True


def test_account_finds_lost_duplicated_foreign_and_misattributed_rows() -> None:
    produced = _log(("t1", 0, 10), ("t2", 0, 11), ("t3", 1, 5))
    stored = _log(("t1", 0, 10), ("t1", 0, 10), ("t2", 1, 99), ("x9", 0, 3))
    counts = account(produced, stored)
    assert counts.lost == 1  # t3
    assert counts.duplicated == 2  # t1 a second time, x9 never produced
    assert counts.provenance_mismatch == 1  # t2 from no record of t2
    assert counts.distinct == 3 and counts.rows == 4 and not counts.ok


def test_account_accepts_any_record_of_a_resent_turn() -> None:
    produced = _log(("t1", 0, 10), ("t1", 0, 12))  # a producer resend: two records, one turn
    counts = account(produced, _log(("t1", 0, 12)))
    assert (counts.produced, counts.records, counts.provenance_mismatch, counts.duplicated) == (1, 2, 0, 0)


def test_takeover_times_from_the_rows() -> None:
    kill = 100.0
    before = [Timed(p, t, t + 0.2) for p in (0, 1) for t in range(80, 100)]  # p95 0.2 s: late means > 1 s
    survivor = [Timed(1, t, t + 0.3) for t in range(100, 130)]
    # partition 0 stalls until 160 s, then drains its backlog by 170 s and is back to 0.2 s
    stalled = [Timed(0, t, 160 + (t - 100) / 6) for t in range(100, 160)]
    fresh = [Timed(0, t, t + 0.2) for t in range(171, 175)]
    found = takeover(before + survivor + stalled + fresh, killed_at=kill, moved=[0])
    assert found.late_s == pytest.approx(1.0)
    assert found.first_store_s == pytest.approx(60.0)
    assert found.caught_up_s == pytest.approx(69.8333, abs=1e-3)
    assert found.backlog == 60
    assert found.others_first_store_s == pytest.approx(0.3)
    assert found.others_max_latency_s == pytest.approx(0.3)


def test_takeover_when_the_moved_partitions_never_store() -> None:
    found = takeover([Timed(1, 99.0, 99.5), Timed(1, 101.0, 101.5)], killed_at=100.0, moved=[0])
    assert found.first_store_s is None and found.caught_up_s is None and found.backlog == 0
    assert found.others_first_store_s == pytest.approx(1.5)


def test_answered_exactly_once() -> None:
    ok = answered(["q1", "q2"], ["q2", "q1"])
    assert ok.exactly_once and ok.as_json()["answered"] == 2
    bad = answered(["q1", "q2", "q3"], ["q1", "q1", "q2", "other"])
    assert (bad.answered, bad.unanswered, bad.answered_twice, bad.exactly_once) == (2, 1, 1, False)
