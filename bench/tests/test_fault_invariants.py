"""The fault suite's checks on made-up observations: they must fail when something is lost, changed,
cut differently from a clean replay, left pending or answered twice."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from bench.faults import workload
from bench.faults.invariants import (
    Counts,
    Observed,
    check_answers,
    check_reads_after,
    check_segments,
    check_turns,
    replay_segments,
)
from bench.faults.observe import StoredSegment, StoredTurn
from epistream.contracts.turns import SegmentCloseRequest
from epistream.pipeline.segmenter import SegmenterConfig

CONFIG = SegmenterConfig(max_tokens=400, overlap_share=0.1, max_gap=timedelta(hours=6))


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def _load() -> workload.Workload:
    return workload.build("u", "unit", workload.TINY)


def _records(load: workload.Workload, *, close_after: dict[str, str]) -> list[Record]:
    out = [Record(0, n, i.key, i.value) for n, i in enumerate(load.plan) if i.topic == "turns"]
    for conversation, turn_id in close_after.items():
        request = SegmentCloseRequest(kind="segment_close", tenant=load.tenant, conversation_id=conversation,
                                      after_turn_id=turn_id)
        out.append(Record(0, len(out) + 100, conversation.encode(), request.to_bytes()))
    return out


def _stored(load: workload.Workload) -> list[StoredTurn]:
    return [StoredTurn(t.conversation_id, t.turn_id, t.speaker, t.text, t.ts, t.session_id, t.metadata)
            for t in load.turns]


def _observed(load: workload.Workload, **kw) -> Observed:  # type: ignore[no-untyped-def]
    return Observed(turns=kw.get("turns", _stored(load)), segments=kw.get("segments", []), letters=[],
                    answers=kw.get("answers", []), questions=[], turn_records=kw.get("turn_records", []))


def test_a_missing_or_changed_turn_is_lost_and_fails_the_check():
    load = _load()
    rows = _stored(load)
    rows[1] = StoredTurn(*[*rows[1].__dict__.values()][:3], "other text", *[*rows[1].__dict__.values()][4:])
    counts = Counts()
    verdict = check_turns(load, None, _observed(load, turns=rows[1:]), counts)
    assert not verdict.ok and (counts.lost, counts.stored) == (2, len(load.turns) - 2)
    assert check_turns(load, None, _observed(load), Counts()).ok


def test_the_replay_follows_the_close_requests_and_a_different_cut_fails():
    load = _load()
    last = {c: [t.turn_id for t in load.turns if t.conversation_id == c][-1] for c in load.conversations}
    records = _records(load, close_after=last)
    cut = replay_segments(records, load.tenant, CONFIG, None)
    assert {c: [(seq, len(ids), reason) for seq, ids, reason in v] for c, v in cut.items()} == {
        c: [(0, 5, "idle")] for c in load.conversations}
    segments = [StoredSegment(c, f"{c}#0000", 0, ids, 0, reason, "enriched", True)
                for c, v in cut.items() for _, ids, reason in v]
    assert check_segments(load, None, _observed(load, segments=segments, turn_records=records), CONFIG,
                          Counts()).ok
    shorter = [StoredSegment(s.conversation_id, s.segment_id, 0, s.turn_ids[:-1], 0, "idle", "enriched", True)
               for s in segments]
    assert not check_segments(load, None, _observed(load, segments=shorter, turn_records=records), CONFIG,
                              Counts()).ok


def test_a_question_answered_twice_is_a_duplicate():
    load = _load()
    qid = load.questions[0].question_id.encode()
    twice = [Record(0, n, qid, b'{"error": null}') for n in range(2)]
    counts = Counts()
    assert not check_answers(load, _observed(load, answers=twice), counts).ok and counts.duplicated == 1
    assert check_answers(load, _observed(load, answers=twice[:1]), Counts()).ok


def test_the_suite_refuses_a_running_stack_started_without_its_worker_settings(tmp_path, monkeypatch):
    import json
    import os

    from bench.faults.__main__ import WORKER_ENV, settings_the_running_stack_lacks
    from epistream.infra import supervisor
    from epistream.settings.processes import Settings

    for name, value in WORKER_ENV.items():
        monkeypatch.setenv(name, value)
    settings = Settings(home=tmp_path)
    assert settings_the_running_stack_lacks(settings) == []  # nothing runs: the suite starts its own
    supervisor.pid_file(tmp_path).parent.mkdir(parents=True)
    supervisor.pid_file(tmp_path).write_text(str(os.getpid()))  # a live supervisor
    recorded = settings.model_dump(mode="json")
    supervisor.state_file(tmp_path).write_text(json.dumps({"settings": recorded}))
    assert settings_the_running_stack_lacks(settings) == []
    supervisor.state_file(tmp_path).write_text(json.dumps({"settings": {**recorded, "segment_idle_s": 300.0}}))
    assert settings_the_running_stack_lacks(settings) == ["segment_idle_s=300.0, wanted 3.0"]


def test_a_read_with_after_that_replied_complete_without_its_turn_fails_the_check():
    assert check_reads_after([(True, True), (False, False), (False, True)]).ok
    stale = check_reads_after([(True, True), (True, False)])
    assert not stale.ok and "1 complete without it" in stale.detail and "reads 1" in stale.detail
    assert not check_reads_after([]).ok  # no read made: nothing was shown
