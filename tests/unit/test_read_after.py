"""Read-your-own-writes, its pure logic: the `after` and `incomplete` fields of the contracts (old
records still decode), the watermark comparison, the bounded wait with its backoff, and the CLI's
and the client's positions. The same through the real stack: tests/integration/test_read_your_writes.py."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping, Sequence, Set

import pytest
from aiokafka.structs import RecordMetadata, TopicPartition

from epistream.apps.cli.main import _after
from epistream.client.session import _note_position, _positions
from epistream.consumers.read_after import (
    MAX_POLL_S,
    PAST_END_AFTER_S,
    incomplete_reason,
    never_reason,
    wait_or_name,
    wait_until_stored,
)
from epistream.contracts.decoding import decode
from epistream.contracts.positions import Position
from epistream.contracts.questions import Question
from epistream.contracts.replies import Answer, MemoryContext
from epistream.errors import ContractError
from epistream.storage.watermarks import beyond_the_log, runs_of, unmet

OLD_QUESTION = b'{"question_id": "q1", "tenant": "t", "question": "Where?", "mode": "context"}'
OLD_CONTEXT = (b'{"kind": "context", "question_id": "q1", "tenant": "t", "asked_at": "2024-05-08T12:00:00+00:00",'
               b' "items": [], "text": "", "budget_tokens": 100, "used_tokens": 0, "latency_ms": 3.0}')
OLD_ANSWER = (b'{"question_id": "q1", "tenant": "t", "answer": "Tangier", "abstained": false, "evidence": [],'
              b' "mode": "fast", "latency_ms": 9.0, "tokens": {}}')


def pos(partition: int, offset: int, conversation: str = "c") -> Position:
    return Position(conversation_id=conversation, partition=partition, offset=offset)


def test_records_from_before_read_your_writes_still_decode():
    assert decode(OLD_QUESTION, Question, what="q").after is None
    assert decode(OLD_CONTEXT, MemoryContext, what="c").incomplete is None
    assert decode(OLD_ANSWER, Answer, what="a").incomplete is None


def test_a_question_carries_its_positions_in_every_mode_and_round_trips():
    for mode in ("context", "fast", "deep", "agentic", "auto"):
        question = Question(question_id="q", tenant="t", question="Where?", mode=mode, after=[pos(2, 41, "trip")])
        assert decode(question.to_bytes(), Question, what="q").after == [pos(2, 41, "trip")]
    assert b"after" not in Question(question_id="q", tenant="t", question="Where?").to_bytes()  # absent, not null


@pytest.mark.parametrize("position", [{"conversation_id": "c", "partition": -1, "offset": 0},
                                      {"conversation_id": "c", "partition": 0, "offset": -1},
                                      {"conversation_id": "", "partition": 0, "offset": 0},
                                      {"conversation_id": "c", "partition": 0, "offset": 0, "topic": "x"}])
def test_a_position_out_of_its_range_is_refused_with_the_reason(position):
    raw = Question(question_id="q", tenant="t", question="Where?").model_dump(mode="json") | {"after": [position]}
    with pytest.raises(ContractError, match="after"):
        decode(json.dumps(raw).encode(), Question, what="question")


def test_a_question_waits_for_at_most_a_thousand_positions():
    with pytest.raises(ValueError, match="1000"):
        Question(question_id="q", tenant="t", question="Where?", after=[pos(0, n) for n in range(1001)])


def test_a_position_is_met_once_its_partition_is_stored_through_its_offset():
    wanted = [pos(0, 5, "a"), pos(1, 3, "b"), pos(2, 0, "c")]
    assert unmet(wanted, {}) == wanted  # nothing stored yet on any partition
    assert unmet(wanted, {0: 4, 1: 3}) == [pos(0, 5, "a"), pos(2, 0, "c")]  # offset 3 itself is stored
    assert unmet(wanted, {0: 9, 1: 3, 2: 0}) == []


def test_a_commit_covers_its_offsets_as_runs_of_consecutive_offsets_per_partition():
    runs = runs_of([("t", 0, 7), ("t", 1, 2), ("t", 0, 3), ("t", 0, 8), ("u", 0, 1), ("t", 0, 4), ("t", 0, 7)])
    assert runs == {("t", 0): [(3, 4), (7, 8)], ("t", 1): [(2, 2)], ("u", 0): [(1, 1)]}
    assert runs_of([]) == {}


class Ingest:
    """Marks that reach each partition's target after a number of polls, on a clock only sleeping moves."""

    def __init__(self, timeline: Sequence[Mapping[int, int]]) -> None:
        self.timeline, self.polls, self.now, self.pauses = list(timeline), 0, 0.0, []

    async def marks(self, partitions: Sequence[int]) -> Mapping[int, int]:
        current = self.timeline[min(self.polls, len(self.timeline) - 1)]
        self.polls += 1
        return {p: o for p, o in current.items() if p in partitions}

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def wait(self, positions: Sequence[Position], timeout_s: float) -> list[Position]:
        return asyncio.run(wait_until_stored(positions, self.marks, timeout_s=timeout_s, sleep=self.sleep,
                                             clock=lambda: self.now))


def test_the_wait_ends_as_soon_as_every_position_is_stored():
    ingest = Ingest([{0: 1}, {0: 4, 1: 0}, {0: 5, 1: 3}])
    assert ingest.wait([pos(0, 5), pos(1, 3)], timeout_s=5.0) == []
    assert ingest.polls == 3 and ingest.pauses == [0.01, 0.02]


def test_a_position_already_stored_is_not_waited_for():
    ingest = Ingest([{0: 10}])
    assert ingest.wait([pos(0, 5)], timeout_s=5.0) == [] and ingest.pauses == []


def test_the_wait_gives_up_at_its_bound_and_names_what_is_missing():
    ingest = Ingest([{0: 9}])
    missing = ingest.wait([pos(0, 5), pos(1, 3, "late")], timeout_s=2.0)
    assert missing == [pos(1, 3, "late")]
    assert ingest.now == pytest.approx(2.0) and max(ingest.pauses) == MAX_POLL_S  # backed off, never past the bound
    assert incomplete_reason(missing, 2.0) == "not stored within 2s: late@1:3; the read may miss those turns"


def test_the_reason_names_three_positions_and_counts_the_rest():
    reason = incomplete_reason([pos(0, n, f"c{n}") for n in range(5)], 5.0)
    assert reason.startswith("not stored within 5s: c0@0:0, c1@0:1, c2@0:2 and 2 more;")


class Log:
    """A turns topic with these partitions, whose ends are read in turn (the last repeats; None: unknown)."""

    def __init__(self, partitions: set[int], ends: Sequence[Mapping[int, int] | None]) -> None:
        self.partitions, self._ends, self.asked = partitions, list(ends), {"lacking": 0, "ends": 0}

    async def lacking(self, partitions: Set[int]) -> set[int]:
        self.asked["lacking"] += 1
        return set(partitions - self.partitions)

    async def ends(self) -> Mapping[int, int] | None:
        self.asked["ends"] += 1
        return self._ends[min(self.asked["ends"] - 1, len(self._ends) - 1)]


def _wait(ingest: Ingest, log: Log, positions: Sequence[Position], timeout_s: float = 5.0):
    return asyncio.run(wait_or_name(positions, ingest.marks, log, timeout_s=timeout_s, sleep=ingest.sleep,
                                    clock=lambda: ingest.now))


def test_a_position_on_a_partition_the_topic_lacks_is_never_waited_for():
    ingest = Ingest([{0: 1}, {0: 4}])
    missing, never = _wait(ingest, Log({0, 1}, [{0: 10, 1: 3}]), [pos(9, 0, "nowhere"), pos(0, 4)])
    assert missing == [] and never == [(pos(9, 0, "nowhere"), "no partition 9")]
    assert ingest.now < PAST_END_AFTER_S  # named at once; only the real position was waited for
    assert never_reason(never, "memory.turns") == ("never produced to memory.turns: nowhere@9:0 (no partition 9); "
                                                   "not waited for")


def test_a_position_past_its_partitions_end_is_named_after_the_first_wait():
    ingest = Ingest([{0: 5}])
    missing, never = _wait(ingest, Log({0}, [{0: 6}]), [pos(0, 1_000_000, "far")])
    assert missing == [] and never == [(pos(0, 1_000_000, "far"), "partition 0 ends at 6")]
    assert ingest.now == pytest.approx(PAST_END_AFTER_S)  # not the whole 5 s bound


def test_a_position_below_the_end_is_waited_for_to_the_bound():
    # The end caught up with the record (a high watermark that trailed an acks=1 produce): a real position.
    ingest = Ingest([{0: 5}])
    missing, never = _wait(ingest, Log({0}, [{0: 7}]), [pos(0, 6)])
    assert missing == [pos(0, 6)] and never == [] and ingest.now == pytest.approx(5.0)


def test_without_the_log_ends_every_position_is_waited_for():
    ingest = Ingest([{0: 5}])
    missing, never = _wait(ingest, Log({0}, [None]), [pos(0, 99)])
    assert missing == [pos(0, 99)] and never == [] and ingest.now == pytest.approx(5.0)


def test_a_read_stored_within_the_first_wait_never_asks_for_the_log_ends():
    log = Log({0}, [])  # an `ends` call would fail: none scripted
    missing, never = _wait(ingest := Ingest([{0: 1}, {0: 3}]), log, [pos(0, 3)])
    assert missing == [] and never == [] and log.asked == {"lacking": 1, "ends": 0} and ingest.polls == 2


def test_the_cli_reads_positions_as_produce_prints_them():
    assert _after("trip@2:41") == pos(2, 41, "trip")
    assert _after("a@b@0:7") == pos(0, 7, "a@b")  # the last '@' separates: a conversation id may hold one
    assert _after("3:9") == pos(3, 9, "*")
    for bad in ("3", "x:1", "1:-2", "@"):
        with pytest.raises(argparse.ArgumentTypeError, match="PARTITION:OFFSET"):
            _after(bad)


def _meta(partition: int, offset: int) -> RecordMetadata:
    return RecordMetadata("memory.turns", partition, TopicPartition("memory.turns", partition), offset, 0, 0, 0)


def test_the_client_keeps_each_conversations_last_acknowledged_position():
    positions: dict[str, Position] = {}
    for key, meta in [(b"a", _meta(0, 4)), (b"b", _meta(1, 2)), (b"a", _meta(0, 9)), (b"a", _meta(0, 6)),
                      (None, _meta(0, 10)), (b"\xff", _meta(0, 11))]:
        _note_position(positions, key, meta)
    assert positions == {"a": pos(0, 9, "a"), "b": pos(1, 2, "b")}
    assert _positions(positions) == [pos(0, 9, "a"), pos(1, 2, "b")]
    assert _positions([pos(0, 1)]) == [pos(0, 1)] and _positions(None) is None


def test_a_mark_at_or_past_its_partitions_end_is_from_an_earlier_incarnation_of_the_topic():
    # Offsets only grow within one topic: stored through 9 needs an end of at least 10.
    assert beyond_the_log({0: 9, 1: 10, 2: 3, 3: -1, 4: 7}, {0: 10, 1: 10, 2: 0, 3: 0}) == {1: 10, 2: 3}
