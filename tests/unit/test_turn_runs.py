"""How a batch's turns are cut into statements (pipeline/store/turns.py): one statement cannot write a
row twice, so a turn there again starts a new run; otherwise the whole batch is one statement."""

from __future__ import annotations

from datetime import UTC, datetime

from epistream.contracts.turns import Turn
from epistream.pipeline.store.turns import distinct_runs


def turn(turn_id: str, conversation: str = "c1", tenant: str = "t1") -> Turn:
    return Turn(tenant=tenant, conversation_id=conversation, turn_id=turn_id, speaker="Ana", text="hello",
                ts=datetime(2024, 5, 1, tzinfo=UTC))


def runs(turns: list[Turn]) -> list[list[int]]:
    return [list(r) for r in distinct_runs(turns)]


def test_distinct_turns_are_one_run() -> None:
    assert runs([turn("a"), turn("b"), turn("c")]) == [[0, 1, 2]]


def test_a_turn_there_again_starts_a_new_run_and_keeps_the_order() -> None:
    assert runs([turn("a"), turn("b"), turn("a"), turn("c"), turn("a")]) == [[0, 1], [2, 3], [4]]


def test_the_same_turn_id_in_another_conversation_or_tenant_is_another_turn() -> None:
    assert runs([turn("a"), turn("a", conversation="c2"), turn("a", tenant="t2")]) == [[0, 1, 2]]


def test_no_turns_no_runs() -> None:
    assert runs([]) == []
