"""A tenant's progress through the pipeline (bench.store_state, what the benchmarks wait on)."""

from __future__ import annotations

import pytest

from bench.store_state import StoreState


@pytest.mark.parametrize(
    ("state", "expected_turns", "finished"),
    [
        (StoreState(turns=10, open_conversations=0, segments=3, enriched=2, failed=1), 10, True),
        (StoreState(turns=9, open_conversations=0, segments=3, enriched=3, failed=0), 10, False),  # a turn missing
        (StoreState(turns=10, open_conversations=1, segments=3, enriched=3, failed=0), 10, False),  # still open
        (StoreState(turns=10, open_conversations=0, segments=3, enriched=2, failed=0), 10, False),  # one pending
        (StoreState(turns=10, open_conversations=0, segments=0, enriched=0, failed=0), 0, False),  # nothing closed
    ],
)
def test_enrichment_is_finished_when_every_turn_is_in_a_finished_segment(state, expected_turns, finished):
    assert state.enrichment_finished(expected_turns) is finished
    assert state.pending == state.segments - state.done_segments


def test_another_tenants_segment_finished_is_progress_so_a_queue_ahead_is_not_a_stall():
    # The CI run of 2026-12-06 called enrichment stalled while the shared enrich worker worked through
    # the segments earlier tests had queued ahead of this tenant's.
    waiting = StoreState(turns=10, open_conversations=0, segments=2, enriched=0, failed=0, store_done=30)
    others_done = StoreState(turns=10, open_conversations=0, segments=2, enriched=0, failed=0, store_done=31)
    assert waiting.progress() != others_done.progress()
    assert waiting.progress() == StoreState(turns=10, open_conversations=0, segments=2, enriched=0, failed=0,
                                            store_done=30).progress()
