"""Deterministic repair of extractor output, without a model."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from epistream.contracts.segments import Segment, SegmentTurn
from epistream.core.names import entity_id, normalize_name, normalize_predicate, resolve_speaker
from epistream.pipeline.enrich import build_messages, postprocess
from epistream.pipeline.prompts import EnrichmentOut

TZ = timezone(timedelta(hours=1))
TURNS = [
    SegmentTurn(turn_id="s1-t03", speaker="Alice", ts=datetime(2024, 1, 17, 19, 14, tzinfo=TZ),
                text="The big news is that I adopted a cat three weeks ago. I named her Miso."),
    SegmentTurn(turn_id="s1-t04", speaker="Bob", ts=datetime(2024, 1, 17, 19, 16, tzinfo=TZ),
                text="My sister Hannah gets married next Saturday in Braga."),
    SegmentTurn(turn_id="s1-t05", speaker="Alice", ts=datetime(2024, 1, 17, 19, 20, tzinfo=TZ),
                text="I have lived in Porto since 2019."),
]
SEGMENT = Segment(tenant="t", conversation_id="c", segment_id="c#0000", seq=0, close_reason="session",
                  overlap_turns=0, token_estimate=100, turns=TURNS)


def out(**values) -> EnrichmentOut:
    base = {"summary": "Alice  adopted a cat; Bob's sister marries.", "gists": [{"text": "x", "turn_ids": []}],
            "facts": [{"subject": "Alice", "predicate": "adopted", "object": "Miso"}]}
    return EnrichmentOut.model_validate({**base, **values})


def test_gist_date_comes_from_the_source_turns_relative_expression():
    e = postprocess(SEGMENT, out(gists=[
        {"text": "I adopted a cat named Miso three weeks ago", "date": "2024-01-17", "turn_ids": ["s1-t03"]},
    ]))
    gist = e.gists[0]
    assert gist.event_date == date(2023, 12, 27) and gist.precision == "week"
    assert gist.text == "2023-12-27: I adopted a cat named Miso three weeks ago (2023-12-27)."
    assert gist.turn_ids == ("s1-t03",) and gist.gist_id == "c#0000/g00"
    assert e.summary == "Alice adopted a cat; Bob's sister marries."


def test_a_model_date_that_matches_the_source_is_kept_and_bad_ids_are_repaired():
    e = postprocess(SEGMENT, out(gists=[
        {"text": "Hannah, Bob's sister, gets married in Braga", "date": "2024-01-27", "turn_ids": ["nope"]},
    ]))
    gist = e.gists[0]
    # "next Saturday" from Wednesday 2024-01-17 is 2024-01-27; the cited id did not exist,
    # so the turn sharing most words stands in.
    assert gist.event_date == date(2024, 1, 27) and gist.turn_ids == ("s1-t04",)


def test_without_any_date_the_gist_is_dated_when_it_was_said():
    e = postprocess(SEGMENT, out(gists=[{"text": "Alice has lived in Porto", "date": "unknown",
                                         "turn_ids": ["s1-t05"]}]))
    assert e.gists[0].event_date == date(2024, 1, 17)


def test_duplicate_and_empty_gists_are_dropped():
    e = postprocess(SEGMENT, out(gists=[
        {"text": "Alice adopted Miso.", "turn_ids": ["s1-t03"]},
        {"text": "alice adopted miso", "turn_ids": ["s1-t03"]},
        {"text": "2024-01-17", "turn_ids": ["s1-t03"]},
    ]))
    assert len(e.gists) == 1


def test_facts_get_speakers_for_first_person_normalised_predicates_and_resolved_qualifiers():
    e = postprocess(SEGMENT, out(facts=[
        {"subject": "I", "predicate": "Adopted", "object": "Miso", "point_in_time": "three weeks ago",
         "turn_ids": ["s1-t03"]},
        {"subject": "Alice", "predicate": "lives in", "object": "Porto", "start_time": "2019",
         "end_time": "garbage", "turn_ids": ["s1-t05"]},
        {"subject": "Alice", "predicate": "adopted", "object": "Miso", "point_in_time": "2023-12-27",
         "turn_ids": ["s1-t03"]},
    ]))
    adopted, lives = e.facts[0], e.facts[1]
    assert (adopted.subject, adopted.predicate, adopted.object) == ("Alice", "adopted", "Miso")
    assert adopted.point_in_time == date(2023, 12, 27)
    assert (lives.predicate, lives.start_time, lives.end_time) == ("lives_in", date(2019, 1, 1), None)
    assert len(e.facts) == 2, "the third fact repeats the first once resolved"
    assert set(e.entities) == {"alice", "bob", "miso", "porto"}


def test_gists_mention_entities_named_in_them_or_in_facts_of_the_same_turn():
    e = postprocess(SEGMENT, out(
        gists=[{"text": "Alice adopted a cat", "turn_ids": ["s1-t03"]}],
        facts=[{"subject": "Alice", "predicate": "adopted", "object": "Miso", "turn_ids": ["s1-t03"]}],
    ))
    assert e.mentions[e.gists[0].gist_id] == ["alice", "miso"]


def test_prompt_lists_each_turn_with_its_time_weekday_id_and_speaker():
    system, user = build_messages(SEGMENT)
    assert "relative times" in system["content"]
    assert "[2024-01-17 19:14 (Wednesday)] (s1-t03) Alice: The big news" in user["content"]
    assert user["content"].startswith("<segment>") and user["content"].endswith("</segment>")


def test_entity_helpers():
    assert normalize_name("The Golden Gate Bridge!") == "golden gate bridge"
    assert normalize_name("Alice's") == "alice"
    assert resolve_speaker("my", "Bob") == "Bob" and resolve_speaker(" Porto ", "Bob") == "Porto"
    assert normalize_predicate(" Lives-In ") == "lives_in"
    assert entity_id("t", "alice") == entity_id("t", "alice") != entity_id("u", "alice")
