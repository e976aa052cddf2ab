"""The pure parts of enrichment's fault policy: the breaker's states and the context fitting."""

from __future__ import annotations

from datetime import UTC, datetime

from epistream.contracts.segments import SegmentTurn
from epistream.core.retry import Backoff
from epistream.models.llm import storable
from epistream.pipeline.breaker import CircuitBreaker
from epistream.pipeline.prompt_fit import fit_turns, marker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_opens_pauses_lets_one_probe_through_and_closes():
    clock = Clock()
    breaker = CircuitBreaker(Backoff(first_s=2.0, cap_s=8.0, jitter_low=1.0, jitter_high=1.0), clock=clock)
    assert breaker.acquire() and breaker.acquire()  # closed: every caller
    breaker.failed()
    assert not breaker.acquire()
    clock.now = 2.0
    assert breaker.acquire() and not breaker.acquire()  # half-open: one probe only
    breaker.failed()  # still down: a longer pause
    clock.now = 5.9
    assert not breaker.allows_call()
    clock.now = 6.0
    assert breaker.acquire()
    breaker.abandoned()  # the probe was cancelled: the next caller probes
    assert breaker.acquire()
    breaker.succeeded()
    assert breaker.acquire() and breaker.acquire() and not breaker.is_open


def _turn(turn_id: str, text: str) -> SegmentTurn:
    return SegmentTurn(turn_id=turn_id, speaker="Ann", text=text, ts=datetime(2024, 1, 1, tzinfo=UTC))


def test_a_segment_that_fits_is_left_whole():
    turns = [_turn("t1", "short"), _turn("t2", "also short")]
    fitted = fit_turns(turns, 1000, line_overhead=40)
    assert fitted.turns == turns and fitted.truncated_chars == 0


def test_the_longest_turns_are_cut_to_one_length_with_a_marker_until_the_segment_fits():
    turns = [_turn("t1", "a" * 100), _turn("t2", "b" * 20_000), _turn("t3", "c" * 9_000)]
    fitted = fit_turns(turns, 6_000, line_overhead=40)
    texts = [t.text for t in fitted.turns]
    assert texts[0] == "a" * 100  # short turns untouched
    assert texts[1].startswith("b") and texts[1].endswith(marker(20_000 - texts[1].index(" [")))
    assert texts[1].index(" [") == texts[2].index(" [")  # cut to the same length
    assert sum(map(len, texts)) + 3 * 40 <= 6_000
    assert fitted.truncated_turns == ("t2", "t3") and fitted.truncated_chars == 29_000 - 2 * texts[1].index(" [")


def test_model_text_loses_only_what_postgresql_cannot_store():
    assert storable("Lis\x00bon\ud800 ok\tfine\u00e9") == "Lisbon ok\tfine\u00e9"
