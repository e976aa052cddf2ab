"""epistream.messaging.faust_fixes on Faust's own code: its consumer's `_new_offset` commits past a
record it fetched and no agent acknowledged when the hole is one offset at the committed position (or
the partition was never committed); with the fix it holds the commit there, and still passes an offset
it never fetched (a transaction marker) as Faust means to."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import Consumer as KafkaConsumer
from faust.types import TP
from intervaltree import IntervalTree

from epistream.messaging import faust_fixes

PARTITION = TP("memory.turns", 0)


def _consumer(committed: int | None, acked: list[int], fetched: list[int]) -> KafkaConsumer:
    """Faust's driver consumer holding the bookkeeping `_new_offset` reads, its fetched records turned
    into messages by its own `_to_message`."""
    consumer = object.__new__(KafkaConsumer)
    consumer.app = SimpleNamespace(consumer_generation_id=1)  # type: ignore[assignment]
    consumer._acked = defaultdict(list, {PARTITION: list(acked)})
    consumer._acked_index = defaultdict(set, {PARTITION: set(acked)})
    consumer._committed_offset = defaultdict(lambda: None, {PARTITION: committed})
    consumer._gap = defaultdict(IntervalTree)
    for offset in fetched:
        consumer._to_message(PARTITION, SimpleNamespace(
            topic=PARTITION.topic, partition=PARTITION.partition, offset=offset, timestamp=None, timestamp_type=0,
            headers=[], key=None, value=b"", checksum=None, serialized_key_size=0, serialized_value_size=0))
    return consumer


@pytest.fixture(scope="module")
def fixed() -> None:
    faust_fixes.apply()


def test_faust_alone_commits_past_a_fetched_record_no_agent_acknowledged():
    # What the fix is for, on Faust's unpatched rule: offset 33 was fetched, never acknowledged.
    consumer = _consumer(33, [34, 35, 36], fetched=[33, 34, 35, 36])
    assert faust_fixes.faust_rule()(consumer, PARTITION) == 37


def test_with_the_fix_that_record_holds_the_commit_until_it_is_acknowledged(fixed):
    consumer = _consumer(33, [34, 35, 36], fetched=[33, 34, 35, 36])
    assert consumer._new_offset(PARTITION) is None
    consumer._acked[PARTITION].append(33)
    consumer._acked_index[PARTITION].add(33)
    assert consumer._new_offset(PARTITION) == 37


def test_a_partition_never_committed_holds_for_its_first_record_too(fixed):
    assert _consumer(None, [1, 2], fetched=[0, 1, 2])._new_offset(PARTITION) is None


def test_an_offset_never_fetched_at_the_committed_position_is_passed_as_faust_means(fixed):
    # A transaction marker at 33: the consumer never receives it.
    assert _consumer(33, [34, 35], fetched=[34, 35])._new_offset(PARTITION) == 36


def test_records_the_group_committed_past_are_forgotten(fixed):
    fetched = {5, 6, 40, 41}
    assert not faust_fixes.held_back(40, 40, fetched)
    assert fetched == {40, 41}
    assert faust_fixes.held_back(40, 41, fetched)


def test_applying_twice_wraps_once(fixed):
    wrapped = Consumer._new_offset
    faust_fixes.apply()
    assert Consumer._new_offset is wrapped
