"""The stall guard's rule: a partition of this worker that trails the end of its log at one committed
offset for stall_s of the agent's idle time, with none of its records in flight, is sought back;
anything else is left alone."""

from __future__ import annotations

from epistream.pipeline.redelivery import StallGuard

P0, P1, OTHER = ("memory.segments", 0), ("memory.segments", 1), ("memory.segments", 2)
MINE = [P0, P1]


def test_a_partition_trailing_at_one_offset_with_nothing_in_flight_stalls_after_stall_s_once():
    guard = StallGuard(stall_s=60)
    lag = {P0: (3, 5), P1: (7, 7)}
    assert guard.stalled(lag, MINE, now=0) == []
    assert guard.stalled(lag, MINE, now=59) == []
    assert guard.stalled(lag, MINE, now=60) == [P0]
    # Timed afresh after the seek: not reported again at once.
    assert guard.stalled(lag, MINE, now=61) == []
    assert guard.stalled(lag, MINE, now=121) == [P0]


class Clock:
    """The guard's clock for `handling`, set by hand like the `now` the tests pass to `stalled`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_catching_up_or_a_record_in_flight_restarts_the_clock():
    clock = Clock()
    guard = StallGuard(stall_s=60, clock=clock)
    guard.stalled({P0: (3, 5)}, MINE, now=0)
    assert guard.stalled({P0: (4, 6)}, MINE, now=50) == []  # the committed offset moved: working
    assert guard.stalled({P0: (4, 6)}, MINE, now=100) == []
    assert guard.stalled({P0: (4, 6)}, MINE, now=110) == [P0]

    guard.stalled({P0: (4, 6)}, MINE, now=200)
    assert guard.stalled({P0: (6, 6)}, MINE, now=230) == []  # caught up
    assert guard.stalled({P0: (6, 7)}, MINE, now=240) == []
    clock.now = 300
    with guard.handling([P0]):
        assert guard.stalled({P0: (6, 7)}, MINE, now=400) == []  # a record in flight: the agent is working
        clock.now = 400
    assert guard.in_flight == 0
    assert guard.stalled({P0: (6, 7)}, MINE, now=401) == []
    assert guard.stalled({P0: (6, 7)}, MINE, now=461) == [P0]


def test_a_record_of_another_partition_in_flight_pauses_the_clock_and_idle_time_resumes_it():
    """An enrich worker holding P1's segment for minutes may have P0's records queued behind it in Faust's
    buffer: not a drop, so P0's clock does not run while the agent works (the CI run of 939c458 saw the
    enrich worker restarted every 134 s while it worked through a queue). Once the agent is idle, P0's
    clock runs, and a partition dropped beside a busy one is still found (issue 39: one clock for all
    partitions, restarted by any record, let a stuck partition wait forever on a busy worker)."""
    clock = Clock()
    guard = StallGuard(stall_s=60, clock=clock)
    lag = {P0: (3, 5), P1: (10, 20)}
    assert guard.stalled(lag, MINE, now=0) == []
    clock.now = 10
    with guard.handling([P1]):  # 10 s idle, then 300 s on one of P1's records
        assert guard.stalled(lag, MINE, now=200) == []
        clock.now = 310
        assert guard.stalled(lag, MINE, now=310) == []
    assert guard.stalled(lag, MINE, now=340) == []  # 40 s idle in all
    for start in (340, 350, 360, 370):  # busy 5 s of every 10: idle time still adds up (45, 50, 55, 60)
        clock.now = start
        with guard.handling([P1]):
            clock.now = start + 5
        assert guard.stalled(lag, MINE, now=start + 10) == ([P0] if start == 370 else [])
    assert guard.in_flight == 0


def test_partitions_of_other_workers_are_never_this_workers_to_seek():
    guard = StallGuard(stall_s=60)
    guard.stalled({OTHER: (0, 9)}, MINE, now=0)
    assert guard.stalled({OTHER: (0, 9)}, MINE, now=1000) == []


def test_a_batch_counts_as_its_records_until_it_is_acknowledged_even_when_it_raised():
    guard = StallGuard()
    try:
        with guard.handling([P0] * 4 + [P1]):
            assert guard.in_flight == 5
            raise RuntimeError("the batch failed")
    except RuntimeError:
        pass
    assert guard.in_flight == 0


def test_a_partition_stalled_again_at_the_offset_it_was_sought_back_to_means_restart():
    guard = StallGuard(stall_s=60)
    lag = {P0: (3, 5)}
    guard.verdict(lag, MINE, now=0)
    assert guard.verdict(lag, MINE, now=60) == ("seek", [P0])
    assert guard.verdict(lag, MINE, now=61) == ("ok", [])
    assert guard.verdict(lag, MINE, now=121) == ("restart", [P0])


def test_a_seek_that_brought_the_records_is_forgotten():
    guard = StallGuard(stall_s=60)
    guard.verdict({P0: (3, 5)}, MINE, now=0)
    assert guard.verdict({P0: (3, 5)}, MINE, now=60) == ("seek", [P0])
    assert guard.verdict({P0: (5, 5)}, MINE, now=70) == ("ok", [])  # the seek worked
    # A later stall, even at an offset it once was sought to, is a first stall again.
    guard.verdict({P0: (5, 9)}, MINE, now=100)
    assert guard.verdict({P0: (5, 9)}, MINE, now=160) == ("seek", [P0])


def test_a_partition_with_nothing_to_fetch_before_its_end_is_caught_up_until_its_log_or_commit_moves():
    guard = StallGuard(stall_s=60)
    assert guard.verdict({P0: (4, 5)}, MINE, now=0) == ("ok", [])
    assert guard.verdict({P0: (4, 5)}, MINE, now=60) == ("seek", [P0])
    guard.nothing_to_fetch(P0, 4, 5)  # offset 4 is a transaction's marker: not sought, not "stalled again"
    assert guard.stalled({P0: (4, 5)}, MINE, now=1000) == []
    # A record after the marker: trailing again, timed afresh.
    assert guard.stalled({P0: (4, 6)}, MINE, now=1000) == []
    assert guard.stalled({P0: (4, 6)}, MINE, now=1060) == [P0]
