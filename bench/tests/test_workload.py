"""The scale workload generator (bench.workload_scale): deterministic, lazy,
valid turns whose time expressions and known answers check out against the generated text (no services)."""

from __future__ import annotations

import hashlib
import re
import statistics
import subprocess
import sys
import tracemalloc
from collections import Counter, defaultdict
from itertools import islice
from pathlib import Path

import pytest

from bench.workload_scale import (
    PLACES,
    PRESETS,
    KnownQuestion,
    TimeMention,
    WorkloadSpec,
    annotated_turns,
    questions,
    spec_for_turns,
    turns,
)
from epistream.contracts.decoding import decode
from epistream.contracts.questions import Question
from epistream.contracts.turns import Turn
from epistream.core.dates import RELATIVE_PATTERN, format_resolved, relative_dates, resolve

ROOT = Path(__file__).resolve().parents[2]
SMALL = WorkloadSpec(tenants=2, conversations_per_tenant=3, sessions_per_conversation=6, turns_per_session=12,
                     long_conversation_sessions=40, seed=5)
TEN_K = PRESETS["10k"]


@pytest.fixture(scope="module")
def ten_k() -> list[tuple[Turn, TimeMention | None]]:
    return list(annotated_turns(TEN_K))


@pytest.fixture(scope="module")
def ten_k_questions() -> list[KnownQuestion]:
    return list(questions(TEN_K))


def _digest(spec: WorkloadSpec) -> str:
    sha = hashlib.sha256()
    for turn in turns(spec):
        sha.update(turn.to_bytes())
    for q in questions(spec):
        sha.update(repr(q).encode())
    return sha.hexdigest()


def test_the_same_spec_gives_the_same_bytes_and_another_seed_other_bytes():
    assert [t.to_bytes() for t in turns(SMALL)] == [t.to_bytes() for t in turns(SMALL)]
    assert list(questions(SMALL)) == list(questions(SMALL))
    other = WorkloadSpec(**{**SMALL.__dict__, "seed": 6})
    assert [t.text for t in turns(other)] != [t.text for t in turns(SMALL)]
    assert _digest(other) != _digest(SMALL)


def test_the_bytes_do_not_depend_on_the_process_hash_seed():
    # str hashes differ per process; a generator that iterated a set of names would differ here
    code = ("from bench.workload_scale import WorkloadSpec; import bench.tests.test_workload as t; "
            "print(t._digest(t.SMALL))")
    digests = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout.strip() for seed in ("1", "2")}
    assert digests == {_digest(SMALL)}


@pytest.mark.parametrize(("name", "size"), [("10k", 10_000), ("100k", 100_000), ("1m", 1_000_000)])
def test_a_preset_is_within_one_percent_of_its_name_with_busy_tenants_and_one_long_conversation(name, size):
    spec = PRESETS[name]
    assert abs(spec.turns - size) <= size // 100
    assert spec.conversations_per_tenant >= 8  # a tenant with many conversations
    assert spec.long_conversation_sessions >= 4 * spec.sessions_per_conversation  # and one large conversation
    assert spec.busy_tenant == spec.conversation_ids()[0][0]
    assert spec.long_conversation == spec.conversation_ids()[-1]
    assert len(set(spec.conversation_ids())) == spec.conversations


def test_spec_for_turns_refuses_a_size_too_small_for_its_shape():
    with pytest.raises(ValueError, match="are too few"):
        spec_for_turns(1_000)
    assert spec_for_turns(5_000).turns == 5_000


def test_the_generated_count_is_the_spec_s_and_ids_are_unique(ten_k):
    assert len(ten_k) == TEN_K.turns
    assert len({t.turn_id for t, _ in ten_k}) == len(ten_k)
    per_conversation = Counter(t.conversation_id for t, _ in ten_k)
    regular = TEN_K.sessions_per_conversation * TEN_K.turns_per_session
    assert per_conversation[TEN_K.long_conversation[1]] == TEN_K.long_conversation_sessions * TEN_K.turns_per_session
    assert Counter(per_conversation.values())[regular] == TEN_K.tenants * TEN_K.conversations_per_tenant


def test_every_turn_validates_and_round_trips_through_decode():
    for turn in turns(SMALL):
        raw = turn.to_bytes()
        assert decode(raw, Turn, what="memory.turns event") == turn
        assert Turn.model_validate(turn.model_dump()) == turn
        assert turn.ts.tzinfo is not None and turn.session_id


def test_turns_come_in_time_order_each_conversation_increasing_and_conversations_interleaved(ten_k):
    instants = [t.ts.timestamp() for t, _ in ten_k]
    assert instants == sorted(instants)
    last: dict[str, float] = {}
    for turn, _ in ten_k:
        assert turn.ts.timestamp() > last.get(turn.conversation_id, float("-inf"))
        last[turn.conversation_id] = turn.ts.timestamp()
    switches = sum(a.conversation_id != b.conversation_id for (a, _), (b, _) in zip(ten_k, ten_k[1:], strict=False))
    assert switches > TEN_K.conversations * TEN_K.sessions_per_conversation  # not one conversation after another


def test_speakers_are_stable_names_two_or_three_per_conversation_alternating(ten_k):
    speakers: dict[str, set[str]] = defaultdict(set)
    previous: dict[tuple[str, str | None], str] = {}
    for turn, _ in ten_k:
        speakers[turn.conversation_id].add(turn.speaker)
        session = (turn.conversation_id, turn.session_id)
        assert previous.get(session) != turn.speaker  # within a session, speakers take turns
        previous[session] = turn.speaker
    assert {len(names) for names in speakers.values()} <= {2, 3}
    assert len({len(names) for names in speakers.values()}) == 2  # both shapes occur


def test_sessions_are_days_apart_within_a_day_each(ten_k):
    days: dict[tuple[str, str], set] = defaultdict(set)
    for turn, _ in ten_k:
        days[(turn.conversation_id, turn.session_id)].add(turn.ts.date())
    assert all(len(d) == 1 for d in days.values())
    by_conversation: dict[str, list] = defaultdict(list)
    for (conversation, _), d in days.items():
        by_conversation[conversation].append(next(iter(d)))
    assert all(len(set(ds)) == len(ds) for ds in by_conversation.values())


def test_turn_lengths_are_locomo_like(ten_k):
    lengths = [len(t.text.split()) for t, _ in ten_k]
    assert 17 <= statistics.median(lengths) <= 23
    assert sum(10 <= n <= 40 for n in lengths) >= 0.95 * len(lengths)
    assert max(lengths) <= 40


def test_every_relative_expression_resolves_to_the_day_the_generator_meant(ten_k):
    precisions = Counter()
    for turn, said in ten_k:
        found = relative_dates(turn.text, turn.ts)
        if said is None:
            assert found == [], turn.text  # no stray expression the generator does not know about
            continue
        at = turn.text.lower().find(said.phrase.lower())  # a sentence may start with it ("Yesterday I ...")
        assert at >= 0 and said.day < turn.ts.date(), turn.text
        resolved = resolve(turn.text[at:at + len(said.phrase)], turn.ts)
        assert resolved is not None and (resolved.value, resolved.precision) == (said.day, said.precision), turn.text
        assert format_resolved(resolved) == said.answer()
        # the only expression the extractor finds is this one ("in March" is absolute to it: none at all)
        assert [phrase.lower() for phrase, _ in found] == ([said.phrase.lower()]
                                                           if RELATIVE_PATTERN.search(said.phrase) else [])
        precisions[said.precision] += 1
    assert set(precisions) == {"day", "week", "month"}


def test_every_known_answer_s_evidence_exists_and_names_its_entity(ten_k, ten_k_questions):
    by_id = {t.turn_id: (t, said) for t, said in ten_k}
    last_ts = {}
    for turn, _ in ten_k:
        last_ts[turn.conversation_id] = turn.ts
    for q in ten_k_questions:
        assert q.evidence_turn_ids and q.asked_at > last_ts[q.conversation_id]
        for turn_id in q.evidence_turn_ids:
            turn, _ = by_id[turn_id]
            assert (turn.tenant, turn.conversation_id) == (q.tenant, q.conversation_id)
            assert q.entity in turn.text, (q, turn.text)
        if q.kind == "temporal":
            (turn, said), = (by_id[i] for i in q.evidence_turn_ids)
            assert said is not None and said.answer() == q.answer
            assert format_resolved(resolve(said.phrase, turn.ts)) == q.answer
        if q.kind == "current" and q.superseded:
            assert q.superseded in by_id[q.evidence_turn_ids[0]][0].text  # "moved from <old> to <new>"
        if q.kind == "previous":
            assert q.question.removesuffix("?").rsplit(" before ", 1)[1] in by_id[q.evidence_turn_ids[0]][0].text


def test_counting_answers_equal_a_recount_of_the_generated_turns(ten_k, ten_k_questions):
    counted = [q for q in ten_k_questions if q.kind == "counting"]
    assert counted and any(int(q.answer) > 1 for q in counted)
    for q in counted:
        speaker, place = re.fullmatch(r"How many times did (.+?) go to (.+)\?", q.question).groups()
        recount = [t.turn_id for t, _ in ten_k
                   if t.conversation_id == q.conversation_id and t.speaker == speaker and f"went to {place}" in t.text]
        assert int(q.answer) == len(recount) and set(q.evidence_turn_ids) == set(recount)


def test_every_kind_of_question_is_asked_and_some_have_a_superseded_answer(ten_k_questions):
    kinds = Counter(q.kind for q in ten_k_questions)
    assert set(kinds) == {"temporal", "counting", "current", "previous"}
    assert any(q.superseded for q in ten_k_questions if q.kind == "current")
    per_conversation = Counter(q.conversation_id for q in ten_k_questions)
    assert max(per_conversation.values()) <= TEN_K.questions_per_conversation
    assert len(per_conversation) == TEN_K.conversations


def test_a_known_question_becomes_a_question_message_scoped_to_its_conversation(ten_k_questions):
    q = ten_k_questions[0]
    message = decode(q.as_contract("q-1").to_bytes(), Question, what="memory.questions event")
    assert (message.tenant, message.conversation_ids, message.question) == (q.tenant, [q.conversation_id], q.question)
    assert message.asked_at == q.asked_at


def test_the_million_turn_preset_streams_lazily():
    tracemalloc.start()
    try:
        first = list(islice(turns(PRESETS["1m"]), 2_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(first) == 2_000
    assert peak < 64 * 2**20  # a million turns held at once would take well over a gigabyte


def test_no_two_mentions_of_a_place_by_one_speaker_resolve_to_the_same_day(ten_k):
    # else a reader could take them for one visit, and the counting answer would be ambiguous
    seen: set[tuple[str, str, str, object]] = set()
    for turn, said in ten_k:
        for place in (p for p in PLACES if f"went to {p}" in turn.text):
            key = (turn.conversation_id, turn.speaker, place, said.day if said else None)
            assert key not in seen, turn.text
            seen.add(key)
    assert len(seen) > 100
