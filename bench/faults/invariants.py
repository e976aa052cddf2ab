"""The guarantees, checked against what a scenario produced once the system has settled.

Each check returns a verdict (ok or failed, with a detail a person can act on); the counts of the
report (stored, lost, duplicated, dead-lettered) come from the same comparisons.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import ConsumerRecord

from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.decoding import decode
from epistream.contracts.segments import Segment
from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.errors import ContractError
from epistream.pipeline.segmenter import SegmenterConfig, SegmenterState, close, estimate_tokens, feed
from epistream.pipeline.store.segments import turn_line

from .observe import StoredSegment, StoredTurn
from .workload import Item, Workload

#: Examples listed in a failed check's detail.
SHOWN = 5


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str

    def as_json(self) -> dict[str, str]:
        return {"status": "ok" if self.ok else "failed", "detail": self.detail}


def _examples(items: Iterable[object]) -> str:
    listed = list(items)
    more = f" (+{len(listed) - SHOWN} more)" if len(listed) > SHOWN else ""
    return ", ".join(map(str, listed[:SHOWN])) + more


@dataclass
class Observed:
    """Everything read back after settling."""

    turns: list[StoredTurn]
    segments: list[StoredSegment]
    letters: list[DeadLetter]
    answers: list[ConsumerRecord]  # memory.answers since the scenario began, committed only, our keys
    questions: list[ConsumerRecord]  # memory.questions since the scenario began, our keys
    turn_records: list[ConsumerRecord]  # memory.turns since the scenario began, our conversations' keys
    leftovers: dict[str, int] = field(default_factory=dict)


@dataclass
class Counts:
    produced: int = 0
    stored: int = 0
    lost: int = 0
    duplicated: int = 0
    dead_lettered: int = 0


def _same(turn: Turn, row: StoredTurn) -> bool:
    return (row.speaker, row.text, row.session_id, row.metadata) == (
        turn.speaker, turn.text, turn.session_id, turn.metadata) and row.ts == turn.ts


def check_turns(workload: Workload, forgotten: str | None, observed: Observed, counts: Counts) -> Verdict:
    """Every valid turn stored exactly once, with the content produced."""
    expected = {(t.conversation_id, t.turn_id): t for t in workload.turns if t.conversation_id != forgotten}
    rows = Counter((r.conversation_id, r.turn_id) for r in observed.turns)
    by_key = {(r.conversation_id, r.turn_id): r for r in observed.turns}
    missing = [k[1] for k in expected if k not in by_key]
    changed = [k[1] for k, t in expected.items() if k in by_key and not _same(t, by_key[k])]
    doubled = [k[1] for k, n in rows.items() if n > 1]
    unexpected = [k[1] for k in by_key if k not in expected and k[0] != forgotten]
    counts.produced = len(expected)
    counts.stored = len(expected) - len(missing) - len(changed)
    counts.lost = len(missing) + len(changed)
    counts.duplicated += sum(n - 1 for n in rows.values() if n > 1)
    problems = [f"{len(what)} {name}: {_examples(what)}" for name, what in
                (("missing", missing), ("stored with other content", changed), ("stored twice", doubled),
                 ("stored but never produced", unexpected)) if what]
    return Verdict(not problems, "; ".join(problems) or f"{len(expected)} turns stored once, content identical")


def check_invalid(invalid: Sequence[Item], observed: Observed) -> Verdict:
    """Every invalid record in the dead-letter topic, with its bytes and a reason."""
    found = {(d.original_key(), d.original_value()): d for d in observed.letters}
    missing = [i.why_invalid for i in invalid if (i.key, i.value) not in found]
    no_reason = [i.why_invalid for i in invalid if (d := found.get((i.key, i.value))) and not d.error_message]
    problems = [f"{len(m)} {n}: {_examples(m)}" for n, m in
                (("not dead-lettered", missing), ("dead-lettered without a reason", no_reason)) if m]
    return Verdict(not problems, "; ".join(problems) or f"{len(invalid)} invalid records dead-lettered with a reason")


def replay_segments(records: Sequence[ConsumerRecord], tenant: str, config: SegmenterConfig,
                    skip: str | None) -> dict[str, list[tuple[int, tuple[str, ...], str]]]:
    """The segments a clean replay of memory.turns cuts, per conversation: the segmenter's pure functions
    over the records in log order (new turn ids only, as the store does; close requests where they stand)."""
    states: dict[str, SegmenterState] = {}
    seen: dict[str, set[str]] = {}
    cut: dict[str, list[tuple[int, tuple[str, ...], str]]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        try:
            event = decode(record.value, (Turn, SegmentCloseRequest), what="memory.turns event")
        except ContractError:
            continue
        conversation = event.conversation_id
        if event.tenant != tenant or conversation == skip:
            continue
        state = states.get(conversation, SegmenterState())
        if isinstance(event, SegmentCloseRequest):
            if not state.open or state.open[-1].turn_id != event.after_turn_id:
                continue
            step = close(state, "idle", config)
        else:
            if event.turn_id in seen.setdefault(conversation, set()):
                continue  # a replayed or corrected turn does not advance the segmenter
            seen[conversation].add(event.turn_id)
            step = feed(state, turn_id=event.turn_id, tokens=estimate_tokens(turn_line(event.speaker, event.text,
                        event.ts)), ts=event.ts, session_id=event.session_id, config=config)
        states[conversation] = step.state
        cut.setdefault(conversation, []).extend((s.seq, s.turn_ids, s.reason) for s in step.closed)
    return cut


def check_segments(workload: Workload, forgotten: str | None, observed: Observed, config: SegmenterConfig,
                   counts: Counts) -> Verdict:
    """The stored segments are the ones a clean replay cuts, and no turn is the new part of two segments."""
    expected = replay_segments(observed.turn_records, workload.tenant, config, forgotten)
    stored: dict[str, list[tuple[int, tuple[str, ...], str]]] = {}
    owners: Counter[tuple[str, str]] = Counter()
    for s in observed.segments:
        if s.conversation_id == forgotten:
            continue
        stored.setdefault(s.conversation_id, []).append((s.seq, s.turn_ids, s.close_reason))
        owners.update((s.conversation_id, t) for t in s.turn_ids[s.overlap_turns:])
    differ = [f"{c}: stored {_brief(stored.get(c, []))} vs replay {_brief(expected.get(c, []))}"
              for c in sorted(set(stored) | set(expected)) if stored.get(c, []) != expected.get(c, [])]
    twice = [t for (_, t), n in owners.items() if n > 1]
    counts.duplicated += len(twice)
    problems = []
    if differ:
        problems.append(f"{len(differ)} conversations cut differently: " + "; ".join(differ[:3]))
    if twice:
        problems.append(f"{len(twice)} turns in two segments: {_examples(twice)}")
    total = sum(len(v) for v in expected.values())
    return Verdict(not problems, "; ".join(problems) or f"{total} segments, as a clean replay cuts them")


def _brief(segments: list[tuple[int, tuple[str, ...], str]]) -> str:
    return "[" + ", ".join(f"#{seq} {len(ids)} turns ({ids[0].rsplit('-', 1)[-1]}..{ids[-1].rsplit('-', 1)[-1]}) "
                           f"{reason}" for seq, ids, reason in segments) + "]"


def _letter_segment(letter: DeadLetter) -> str | None:
    try:
        return Segment.from_bytes(letter.original_value()).segment_id
    except ValueError:
        return None


def check_enrichment(forgotten: str | None, observed: Observed) -> Verdict:
    """Every segment enriched, or failed with its dead letter; none left pending."""
    lettered = {sid for d in observed.letters if (sid := _letter_segment(d)) is not None}
    mine = [s for s in observed.segments if s.conversation_id != forgotten]
    pending = [s.segment_id for s in mine if s.status == "pending"]
    unlettered = [s.segment_id for s in mine if s.status == "failed" and s.segment_id not in lettered]
    failed = sum(1 for s in mine if s.status == "failed")
    problems = [f"{len(m)} {n}: {_examples(m)}" for n, m in
                (("left pending", pending), ("failed without a dead letter", unlettered)) if m]
    return Verdict(not problems, "; ".join(problems) or f"{len(mine) - failed} enriched, {failed} dead-lettered")


def check_answers(workload: Workload, observed: Observed, counts: Counts) -> Verdict:
    """Every question answered exactly once (by question_id), or dead-lettered."""
    answers = Counter(r.key.decode() for r in observed.answers if r.key)
    asked = Counter(r.key.decode() for r in observed.questions if r.key)
    lettered = {(d.original_key() or b"").decode(errors="replace") for d in observed.letters}
    unanswered = [q.question_id for q in workload.questions
                  if answers[q.question_id] == 0 and q.question_id not in lettered]
    # A question the producer had to resend may be in the topic twice: those extra answers are its doing.
    twice = [q.question_id for q in workload.questions if answers[q.question_id] > max(1, asked[q.question_id])]
    counts.duplicated += sum(answers[q] - max(1, asked[q]) for q in twice)
    errors = [json.loads(r.value).get("error") for r in observed.answers if r.value]
    problems = [f"{len(m)} {n}: {_examples(m)}" for n, m in
                (("unanswered", unanswered), ("answered more than once", twice)) if m]
    with_error = sum(1 for e in errors if e)
    note = f" ({with_error} answers carry an error)" if with_error else ""
    return Verdict(not problems, "; ".join(problems) + note if problems else
                   f"{len(workload.questions)} questions answered once{note}")


def check_forgotten(forgotten: str | None, observed: Observed) -> Verdict | None:
    if forgotten is None:
        return None
    left = {k: v for k, v in observed.leftovers.items() if v != 0}
    return Verdict(not left, f"left of {forgotten}: {left}" if left else
                   f"nothing of {forgotten} in {', '.join(observed.leftovers)}")


def check_reads_after(reads: Sequence[tuple[bool, bool]]) -> Verdict:
    """Each read with `after` held its turn or said it was incomplete: none replied complete without it."""
    stale = [n for n, (complete, holds) in enumerate(reads) if complete and not holds]
    complete = sum(1 for c, h in reads if c and h)
    detail = (f"{len(reads)} reads with `after`: {complete} complete with their turn, "
              f"{sum(1 for c, _ in reads if not c)} incomplete, {len(stale)} complete without it")
    return Verdict(not stale and bool(reads), detail + (f" (reads {_examples(stale)})" if stale else ""))


def check_all(workload: Workload, forgotten: str | None, observed: Observed,
              config: SegmenterConfig, reads_after: Sequence[tuple[bool, bool]] | None = None,
              ) -> tuple[Counts, dict[str, Any]]:
    counts = Counts(dead_lettered=len(observed.letters))
    verdicts = {
        "turns_stored_once_identical": check_turns(workload, forgotten, observed, counts),
        "invalid_records_dead_lettered": check_invalid(workload.invalid, observed),
        "segments_match_clean_replay": check_segments(workload, forgotten, observed, config, counts),
        "segments_enriched_or_dead_lettered": check_enrichment(forgotten, observed),
        "questions_answered_once": check_answers(workload, observed, counts),
    }
    if (forgot := check_forgotten(forgotten, observed)) is not None:
        verdicts["forgotten_leaves_nothing"] = forgot
    if reads_after is not None:
        verdicts["reads_after_never_stale"] = check_reads_after(reads_after)
    return counts, {name: v.as_json() for name, v in verdicts.items()}
