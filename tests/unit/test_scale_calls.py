"""bench.scale.calls: the enrichment calls a stream of turns would cost, counted with the segmenter's
pure logic and the enrich worker's own prompt builder."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.scale.calls import CallCounter, Tally, count, prompt_cost
from bench.workload_scale import WorkloadSpec, turns
from epistream.contracts import Segment, SegmentTurn, Turn
from epistream.pipeline.enrich import build_messages
from epistream.prompts import estimate_tokens
from epistream.settings import Settings

# The defaults, whatever the environment says: the integration tests' conftest sets small segments
# for the test stack in os.environ, and pytest imports it before this module.
SETTINGS = Settings(**{name: field.default for name, field in Settings.model_fields.items()
                       if name.startswith(("segment_", "extractor_", "model_ctx"))})
SPEC = WorkloadSpec(tenants=1, conversations_per_tenant=2, sessions_per_conversation=3, turns_per_session=6,
                    long_conversation_sessions=4)
T0 = datetime(2024, 1, 1, 9, 0, tzinfo=UTC)


def turn(i: int, *, minutes: float, session: str = "s1", text: str = "hello there", conv: str = "c1") -> Turn:
    return Turn(tenant="t", conversation_id=conv, turn_id=f"{conv}:{i}", speaker="Ann", text=text,
                ts=T0 + timedelta(minutes=minutes), session_id=session)


def test_each_session_of_the_workload_is_one_segment_and_one_call():
    long = SPEC.long_conversation
    tallies = count(turns(SPEC), SETTINGS, lambda t, c: "long" if (t, c) == long else "many")
    sessions = 2 * 3 + 4
    assert tallies["all"].turns == SPEC.turns == sessions * 6
    assert tallies["all"].segments == tallies["all"].model_calls == sessions
    assert (tallies["many"].segments, tallies["long"].segments) == (6, 4)
    assert tallies["all"].row()["calls_per_1000_turns"] == round(1000 / 6, 2)
    # Played in real time, the days between sessions close each one as idle; the carried overlap is
    # dropped at the next session's boundary, so the count is that of a replay without idle closes.
    assert tallies["all"].reasons == {"idle": sessions}
    counter = CallCounter(SETTINGS, idle=False)
    fast = [c for t in turns(SPEC) for c in counter.add(t)] + counter.finish()
    assert len(fast) == sessions and sum(c.segment.reason == "session" for c in fast) == sessions - 3
    assert sum(c.prompt_tokens for c in fast) == tallies["all"].prompt_tokens


def test_a_budget_close_carries_turns_whose_text_is_in_the_next_prompt_too():
    settings = SETTINGS.with_overrides(segment_max_tokens=100, segment_overlap=0.5)
    counter = CallCounter(settings)
    calls = [c for i in range(12) for c in counter.add(turn(i, minutes=i, text="word " * 20))] + counter.finish()
    assert [c.segment.reason for c in calls][:1] == ["budget"] and calls[-1].segment.reason == "idle"
    assert calls[1].segment.overlap_turns > 0
    carried = calls[1].segment.turn_ids[0]
    assert carried in calls[0].segment.turn_ids
    covered = {t for c in calls for t in c.segment.turn_ids}
    assert covered == {f"c1:{i}" for i in range(12)}


def test_a_quiet_gap_inside_a_session_closes_as_idle():
    counter = CallCounter(SETTINGS)  # segment_idle_s 300 s, segment_max_gap_s 6 h
    calls = counter.add(turn(0, minutes=0)) + counter.add(turn(1, minutes=1))
    assert calls == []
    calls = counter.add(turn(2, minutes=30))  # 29 minutes of quiet, same session, under max_gap
    assert [c.segment.reason for c in calls] == ["idle"] and calls[0].segment.turn_ids == ("c1:0", "c1:1")
    assert CallCounter(SETTINGS, idle=False).add(turn(0, minutes=0)) == []


def test_a_segment_too_long_for_the_context_is_cut_not_split():
    settings = SETTINGS.with_overrides(model_ctx=2048, extractor_max_tokens=512)
    big = "x" * 20_000
    segment = Segment(tenant="t", conversation_id="c1", segment_id="c1#0000", seq=0, close_reason="budget",
                      overlap_turns=0, token_estimate=5000,
                      turns=[SegmentTurn(turn_id="c1:0", speaker="Ann", text=big, ts=T0),
                             SegmentTurn(turn_id="c1:1", speaker="Bo", text="short", ts=T0)])
    tokens, cut = prompt_cost(segment, settings)
    assert cut > 0 and tokens <= 2048 - 512
    whole = sum(estimate_tokens(m["content"]) for m in build_messages(segment))
    assert tokens < whole
    counter = CallCounter(settings.with_overrides(segment_max_tokens=100_000))
    calls = counter.add(turn(0, minutes=0, text=big)) + counter.finish()
    assert len(calls) == 1 and calls[0].truncated_chars > 0


def test_tally_rows_are_per_thousand_turns():
    tally = Tally(turns=2000, segments=90, model_calls=90, prompt_tokens=100_000, prompt_tokens_per_call=[1, 3, 2])
    row = tally.row()
    assert row["calls_per_1000_turns"] == 45.0 and row["prompt_tokens_per_1000_turns"] == 50_000
    assert row["prompt_tokens_per_call"] == {"p50": 2, "max": 3}
    assert Tally().row()["calls_per_1000_turns"] is None
