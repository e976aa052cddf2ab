"""The offset a partition commits while its questions finish out of order (consumers/commit_window.py)."""

from __future__ import annotations

import random

import pytest

from epistream.consumers.commit_window import MAX_SPAN, CommitWindow, decode_done, encode_done


def test_a_later_question_is_published_at_once_and_the_commit_stays_at_the_open_one():
    window: CommitWindow[str] = CommitWindow(start=10)
    for offset in (10, 11, 12):
        window.begin(offset)
    window.finish(12, "c")
    batch = window.take()
    assert batch is not None and [o for o, _ in batch.items] == [12]
    assert batch.commit_offset == 10 and decode_done(10, batch.metadata) == {12}
    window.committed(batch)
    window.finish(10, "a")
    batch = window.take()
    assert batch is not None and batch.commit_offset == 11 and decode_done(11, batch.metadata) == {12}
    window.committed(batch)
    window.finish(11, "b")
    batch = window.take()
    assert batch is not None and batch.commit_offset == 13 and decode_done(13, batch.metadata) == set()


def test_a_new_owner_skips_what_the_metadata_names_and_answers_the_rest():
    window: CommitWindow[str] = CommitWindow(start=10, done=decode_done(10, encode_done(10, {12, 14})))
    assert [o for o in range(9, 16) if window.skips(o)] == [9, 12, 14]


def test_nothing_ready_is_no_batch_and_a_skipped_record_lets_the_commit_pass():
    window: CommitWindow[str] = CommitWindow(start=5, done={6})
    assert window.take() is None
    window.begin(5)
    window.seen(6)  # published by the previous owner
    window.begin(7)
    window.finish(7, "x")
    batch = window.take()
    assert batch is not None and batch.commit_offset == 5 and decode_done(5, batch.metadata) == {6, 7}
    window.committed(batch)
    window.finish(5, "y")
    batch = window.take()
    assert batch is not None and batch.commit_offset == 8


def test_metadata_of_another_writer_or_damaged_reads_as_nothing_done():
    assert decode_done(3, None) == decode_done(3, "") == decode_done(3, "something else") == set()
    assert decode_done(3, "epistream-done:1,x") == set()


def test_a_full_window_fits_the_brokers_default_metadata_limit():
    assert len(encode_done(0, range(1, MAX_SPAN))) <= 4096


@pytest.mark.parametrize("seed", range(200))
def test_any_finishing_order_commits_monotonically_and_never_past_an_unpublished_question(seed):
    """Whatever order questions finish in, and however they batch, the committed offset never goes
    back, never passes a question not yet published, and the metadata names exactly the published
    questions past it: a new owner starting from any commit answers each question once."""
    rng = random.Random(seed)
    order = rng.sample(range(20), 20)
    every = rng.randint(1, 5)
    window: CommitWindow[int] = CommitWindow(start=0)
    for offset in range(20):
        window.begin(offset)
    published: set[int] = set()
    last = 0
    for i, offset in enumerate(order, start=1):
        window.finish(offset, offset)
        if i % every and i != len(order):
            continue
        batch = window.take()
        assert batch is not None
        published |= {o for o, _ in batch.items}
        assert batch.commit_offset >= last and all(o in published for o in range(batch.commit_offset))
        restart_skips = set(range(batch.commit_offset)) | decode_done(batch.commit_offset, batch.metadata)
        assert restart_skips == published
        window.committed(batch)
        last = batch.commit_offset
    assert last == 20
