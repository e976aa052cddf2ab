"""Deep mode's reading windows, merged and packed (the pure half of consumers/windows.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from epistream.consumers.retrieval import RetrievedTurn, WindowRecipe
from epistream.consumers.windows import merge_windows, turn_tokens

T0 = datetime(2024, 5, 6, 9, 0, tzinfo=UTC)


def _turn(i: int, conversation: str = "c", words: int = 4) -> RetrievedTurn:
    return RetrievedTurn(conversation_id=conversation, turn_id=f"t{i:02d}", speaker="Ana", text="word " * words,
                         ts=T0 + timedelta(minutes=i), session_id=None, score=0.0, dense_rank=None,
                         lexical_rank=None, segment_id=f"{conversation}#{i // 10:04d}")


def _around(seeds: list[RetrievedTurn], each_side: int, last: int = 99) -> dict[int, list[RetrievedTurn]]:
    out = {}
    for n, seed in enumerate(seeds, start=1):
        i = int(seed.turn_id[1:])
        out[n] = [_turn(j, seed.conversation_id) for j in range(max(0, i - each_side), min(last, i + each_side) + 1)
                  if j != i]
    return out


def test_windows_that_share_a_turn_are_one_and_each_turn_is_read_once():
    seeds = [_turn(10), _turn(13), _turn(40)]
    windows = merge_windows(seeds, _around(seeds, 2), WindowRecipe(windows=5, budget_tokens=10_000))
    assert [sorted(w.turns) for w in windows] == [[f"t{i:02d}" for i in range(8, 16)],
                                                  [f"t{i:02d}" for i in range(38, 43)]]
    read = [t.turn_id for w in windows for t in w.text().turns]
    assert len(read) == len(set(read))


def test_a_window_is_read_in_time_order_and_its_turns_keep_their_segments():
    seeds = [_turn(11)]
    (window,) = merge_windows(seeds, _around(seeds, 2), WindowRecipe())
    text = window.text()
    assert [t.turn_id for t in text.turns] == ["t09", "t10", "t11", "t12", "t13"]
    assert text.segment_id == "c#0001" and text.turns[0].segment_id == "c#0000"


def test_the_budget_and_the_window_count_hold_and_the_best_seeds_come_first():
    seeds = [_turn(i * 10, words=40) for i in range(1, 8)]
    cost = sum(turn_tokens(t) for t in [seeds[0], *_around(seeds, 1)[1]])
    windows = merge_windows(seeds, _around(seeds, 1), WindowRecipe(windows=5, budget_tokens=3 * cost))
    assert [w.segment_id for w in windows] == ["c#0001", "c#0002", "c#0003"]
    assert sum(w.tokens for w in windows) <= 3 * cost
    capped = merge_windows(seeds, _around(seeds, 1), WindowRecipe(windows=2, budget_tokens=100_000))
    assert len(capped) == 2


def test_the_same_turn_ids_in_two_conversations_are_two_windows():
    seeds = [_turn(5, "a"), _turn(5, "b")]
    windows = merge_windows(seeds, _around(seeds, 1), WindowRecipe())
    assert [w.conversation_id for w in windows] == ["a", "b"]
