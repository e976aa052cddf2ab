"""The gap watch (pipeline/gaps.py): which gaps under the read-your-own-writes mark are due for a look
at the log, and when a seek back to one has already been tried."""

from __future__ import annotations

from epistream.pipeline.gaps import GapWatch


def test_a_gap_is_due_once_it_has_lasted_the_grace_and_then_is_timed_afresh():
    watch = GapWatch(grace_s=60.0)
    assert watch.due({0: (2, 4)}, {0, 1}, now=0.0) == []
    assert watch.due({0: (2, 4)}, {0, 1}, now=59.0) == []
    assert watch.due({0: (2, 4)}, {0, 1}, now=60.0) == [(0, (2, 4))]
    assert watch.due({0: (2, 4)}, {0, 1}, now=61.0) == []  # timed afresh after its look
    assert watch.due({0: (2, 4)}, {0, 1}, now=120.0) == [(0, (2, 4))]


def test_a_gap_that_changes_or_closes_starts_again_and_another_workers_partition_is_never_due():
    watch = GapWatch(grace_s=60.0)
    watch.due({0: (2, 4), 5: (7, 9)}, {0}, now=0.0)
    assert watch.due({0: (3, 4), 5: (7, 9)}, {0}, now=60.0) == []  # partly filled: a batch is at work on it
    assert watch.due({5: (7, 9)}, {0}, now=200.0) == []  # closed; partition 5 is not this worker's
    assert watch.due({0: (3, 4)}, {0}, now=201.0) == []
    assert watch.due({0: (3, 4)}, {0}, now=261.0) == [(0, (3, 4))]


def test_a_second_seek_back_to_the_same_gap_is_refused_and_a_gap_that_moved_clears_the_seek():
    watch = GapWatch(grace_s=1.0)
    assert watch.sought(0, (2, 4)) is True
    assert watch.sought(0, (2, 4)) is False  # the seek brought nothing: the consumer is stuck
    watch.due({0: (4, 6)}, {0}, now=0.0)  # 2..3 stored since: that seek worked
    assert watch.sought(0, (4, 6)) is True
