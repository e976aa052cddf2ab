"""Tool results as the agent sees them: a bounded observation is valid JSON within
its budget, made by leaving out whole items (and counting them), and the evidence
a result carries does not depend on how much of it was shown."""

from __future__ import annotations

import json
import random
from datetime import date, datetime, timedelta, timezone

import pytest

from epistream.consumers.assistants import QuotedTurn
from epistream.consumers.tools import AssistantReadResult, SegmentResult
from epistream.consumers.tools.observations import (
    EntityContextsResult,
    GistContextsResult,
    NotFoundResult,
    RetrievalResult,
)
from epistream.consumers.tools.results import (
    EntityContexts,
    EntityRef,
    FactRow,
    GistContexts,
    GistHit,
    SegmentRead,
    TurnHit,
)
from epistream.consumers.tools.shaping import Cut, bounded_json

LOCAL = timezone(timedelta(hours=1))
SAID = datetime(2024, 9, 30, 20, 0, tzinfo=LOCAL)
BUDGETS = [2, 3, 10, 25, 60, 150, 400, 1000, 3000, 10_000, 1_000_000]


def gist(i: int, text: str | None = None) -> GistHit:
    return GistHit(gist_id=f"seg{i // 10}/g{i % 10:02d}", conversation_id="conv", segment_id=f"seg{i // 10}",
                   text=text or f"2024-09-{1 + i % 28:02d}: Alice ran race number {i} — “quoted” ünïcode.",
                   event_date=date(2024, 9, 1 + i % 28), date_precision="day", turn_ids=[f"t{i:03d}"],
                   said_at=SAID + timedelta(hours=i), score=1 / (i + 3))


def turn(i: int, text: str | None = None, segment_id: str | None = "seg0") -> TurnHit:
    return TurnHit(conversation_id="conv", turn_id=f"t{i:03d}", speaker="Alice" if i % 2 else "Bob",
                   text=text if text is not None else f"Turn {i}: " + "words " * 30, ts=SAID + timedelta(minutes=i),
                   session_id="s1", segment_id=segment_id)


def fact(i: int) -> FactRow:
    return FactRow(fact_id=f"seg0/f{i:02d}", conversation_id="conv", segment_id="seg0", subject="Alice",
                   predicate="ran_race", object=f"Race {i}", point_in_time=date(2024, 1, 1) + timedelta(days=i),
                   start_time=None, end_time=None, said_at=SAID + timedelta(days=i), turn_ids=[f"t{i:03d}"])


def retrieval(n: int = 40) -> RetrievalResult:
    return RetrievalResult("semantic_retrieve", "gists", date(2024, 1, 1), date(2024, 12, 31),
                           [gist(i) for i in range(n)])


def shown(text: str, max_chars: int) -> dict:
    assert len(text) <= max_chars, f"{len(text)} characters over a budget of {max_chars}"
    return json.loads(text)  # valid JSON, whatever the budget


@pytest.mark.parametrize("max_chars", BUDGETS)
def test_a_retrieval_keeps_whole_results_in_rank_order_and_counts_the_rest(max_chars):
    result = retrieval()
    full = result.payload()["results"]
    seen = shown(result.observation(max_chars), max_chars)
    kept = seen.get("results", [])
    assert kept == full[:len(kept)], "whole items, the best ranked first"
    if len(kept) == len(full):
        assert "omitted" not in seen
    elif "results" in seen:
        assert seen["omitted"] == {"results": len(full) - len(kept)}
        assert seen["tool"] == "semantic_retrieve" and seen["range"] == {"start": "2024-01-01", "end": "2024-12-31"}
    if max_chars >= 3000:
        assert len(kept) >= 8, "a useful budget shows a useful page"


def test_budgets_from_tiny_to_huge_give_more_items_never_fewer():
    result = retrieval()
    counts = [len(shown(result.observation(b), b).get("results", [])) for b in BUDGETS]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 40


def test_what_fits_is_shown_as_it_is():
    result = retrieval(3)
    text = result.observation(100_000)
    assert text == json.dumps(result.payload()) and "omitted" not in json.loads(text)
    # The tightest budget that shows everything: not one item left out, no omitted key.
    assert json.loads(result.observation(len(text)))["results"] == result.payload()["results"]
    cut = json.loads(result.observation(len(text) - 1))
    assert cut["omitted"] == {"results": 1} and len(cut["results"]) == 2


def test_the_old_slice_broke_json_and_the_observation_does_not():
    result = retrieval()
    sliced = json.dumps(result.payload(), default=str)[:3000]
    with pytest.raises(json.JSONDecodeError):
        json.loads(sliced)
    seen = shown(result.observation(3000), 3000)
    assert seen["omitted"]["results"] == 40 - len(seen["results"])


@pytest.mark.parametrize("max_chars", BUDGETS)
def test_evidence_is_everything_the_result_holds_whatever_the_budget(max_chars):
    result = retrieval()
    before = result.evidence()
    seen = shown(result.observation(max_chars), max_chars)
    assert result.evidence() == before and list(before) == [g.gist_id for g in result.hits]
    for item in seen.get("results", []):
        evidence = before[item["gist_id"]]
        assert (evidence.quote, evidence.turn_ids, evidence.segment_id) == (
            item["text"], item["turn_ids"], item["segment_id"])
        assert evidence.time.isoformat() == item["said_at"]


@pytest.mark.parametrize("max_chars", BUDGETS)
def test_entity_contexts_cut_facts_first_and_keep_the_count(max_chars):
    facts = [fact(i) for i in range(30)]
    contexts = EntityContexts(facts=facts, total=57, aggregate="count", count=57, subjects=["Alice"],
                              objects=[], predicates=["ran_race"])
    result = EntityContextsResult("find_entity_contexts", None, None, contexts)
    seen = shown(result.observation(max_chars), max_chars)
    if "facts" in seen:
        kept = seen["facts"]
        assert kept == result.payload()["facts"][:len(kept)]
        assert seen.get("omitted", {}).get("facts", 0) == 30 - len(kept)
        assert seen["count"] == 57 and seen["total"] == 57
        if kept:
            assert "subjects" not in seen.get("omitted", {}), "the names go only after every fact"
    evidence = result.evidence()
    assert list(evidence) == [f.fact_id for f in facts]
    assert evidence["seg0/f03"].quote == "Alice ran_race Race 3" and evidence["seg0/f03"].turn_ids == ["t003"]


@pytest.mark.parametrize("max_chars", BUDGETS)
def test_gist_contexts_leave_out_paraphrases_first_and_keep_the_nearest_neighbours(max_chars):
    contexts = GistContexts(
        gist=gist(5), source_turns=[turn(5, segment_id=None)], before=[gist(1), gist(2), gist(3)],
        after=[gist(6), gist(7), gist(8)], entities=[EntityRef("e/alice", "Alice", ["Ali"])],
        similar=[gist(11), gist(12)])
    result = GistContextsResult("find_gist_contexts", contexts)
    full = result.payload()
    seen = shown(result.observation(max_chars), max_chars)
    omitted = seen.get("omitted", {})
    for key in ("similar", "after", "entities", "source_turns"):
        if key in seen:
            assert seen[key] == full[key][:len(seen[key])]
            assert omitted.get(key, 0) == len(full[key]) - len(seen[key])
    if "before" in seen:  # oldest first: the nearest (last) ones stay
        assert seen["before"] == full["before"][len(full["before"]) - len(seen["before"]):]
        assert omitted.get("before", 0) == 3 - len(seen["before"])
    order = ["similar", "after", "before", "entities", "source_turns"]
    for earlier, later in zip(order, order[1:]):
        if omitted.get(later) and "gist" in seen:
            assert seen[earlier] == [], f"{earlier} goes before any of {later}"
    if "gist" in seen:
        assert seen["gist"] == full["gist"] and seen["found"] is True
    evidence = result.evidence()
    assert list(evidence) == ["seg0/g05", "t005", "seg0/g01", "seg0/g02", "seg0/g03", "seg0/g06", "seg0/g07",
                              "seg0/g08", "seg1/g01", "seg1/g02"]
    assert evidence["t005"].segment_id is None and evidence["t005"].speaker == "Alice"


def test_a_long_segment_drops_its_turns_before_shortening_its_text():
    raw = "\n".join(f"[2024-09-30 20:{i:02d}] Alice: " + "words " * 40 for i in range(40))
    segment = SegmentRead(segment_id="seg0", conversation_id="conv", seq=0, start_ts=SAID, end_ts=SAID,
                          status="enriched", summary="Summary of seg0.", raw_text=raw,
                          turns=[turn(i) for i in range(12)])
    result = SegmentResult("read_segment", segment)
    assert len(json.dumps(result.payload()["segment"]["raw_text"])) > 3000
    seen = shown(result.observation(3000), 3000)
    assert seen["segment"]["turns"] == [] and seen["omitted"] == {"segment.turns": 12}
    assert seen["segment"]["raw_text"].endswith("…[truncated]")
    assert seen["segment"]["raw_text"][:100] == raw[:100] and seen["segment"]["summary"] == "Summary of seg0."
    for max_chars in BUDGETS:
        shown(result.observation(max_chars), max_chars)
    assert list(result.evidence()) == [f"t{i:03d}" for i in range(12)]


def test_an_assistant_read_shows_its_quotes_and_cites_them():
    quotes = [QuotedTurn("seg0", "conv", f"t{i:03d}", "Alice", f"I moved to Lisbon, part {i}", SAID)
              for i in range(20)]
    result = AssistantReadResult("seg0", "Summary.", quotes)
    seen = shown(result.observation(600), 600)
    assert set(seen) == {"segment_id", "summary", "quotes", "omitted"}
    assert seen["quotes"][0] == {"turn_id": "t000", "speaker": "Alice", "text": "I moved to Lisbon, part 0",
                                 "ts": SAID.isoformat(), "conversation_id": "conv", "segment_id": "seg0"}
    assert seen["omitted"] == {"quotes": 20 - len(seen["quotes"])}
    evidence = result.evidence()
    assert len(evidence) == 20 and evidence["t003"].quote == "I moved to Lisbon, part 3"
    assert evidence["t003"].turn_ids == ["t003"] and evidence["t003"].speaker == "Alice"


def test_not_found_and_tiny_budgets():
    missing = NotFoundResult("find_gist_contexts", "no gist 'seg9/g00' in this memory")
    assert json.loads(missing.observation(3000)) == {"tool": "find_gist_contexts", "found": False,
                                                     "error": "no gist 'seg9/g00' in this memory"}
    assert missing.evidence() == {}
    for max_chars in range(2, 80):
        shown(missing.observation(max_chars), max_chars)
    with pytest.raises(ValueError):
        missing.observation(1)


def test_turns_with_empty_text_are_no_evidence():
    result = RetrievalResult("lexical_retrieve", "turns", None, None, [turn(1, text=""), turn(2)])
    assert list(result.evidence()) == ["t002"]


def test_any_payload_at_any_budget_is_valid_json_within_it():
    rng = random.Random(7)
    for _ in range(200):
        payload = {
            "tool": "x" * rng.randint(1, 30),
            "head": "é" * rng.randint(0, 300),
            "a": [{"id": i, "text": "t" * rng.randint(0, 200)} for i in range(rng.randint(0, 15))],
            "nested": {"b": [rng.choice(["short", "ü" * 50, 3, None]) for _ in range(rng.randint(0, 10))]},
        }
        cuts = [Cut(("a",)), Cut(("nested", "b"), keep_last=True)]
        max_chars = rng.randint(2, 4000)
        seen = shown(bounded_json(payload, cuts, max_chars), max_chars)
        for name, items in (("a", seen.get("a")), ("nested.b", seen.get("nested", {}).get("b"))):
            if items is not None and "omitted" in seen and name in seen["omitted"]:
                whole = payload["a"] if name == "a" else payload["nested"]["b"]
                assert len(items) + seen["omitted"][name] == len(whole)
