"""The hostile corpus (epistream/testing/hostile.py) agrees with the contract: each case decodes to the
row it says it leaves, or is refused with its reason."""

from __future__ import annotations

import pytest

from epistream.contracts.decoding import decode
from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.errors import ContractError
from epistream.testing.hostile import CASES, HostileCase, expected_rows


def test_the_corpus_is_big_and_varied_enough():
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)
    assert {c.expect for c in CASES} == {"stored", "dead"} and len({c.key for c in CASES}) == 1
    assert max(len(c.value) for c in CASES) >= 990_000


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_case_decodes_as_labelled(case: HostileCase):
    if case.expect == "dead":
        with pytest.raises(ContractError) as caught:
            decode(case.value, (Turn, SegmentCloseRequest), what="memory.turns event")
        assert case.reason and case.reason in str(caught.value)
        return
    turn = decode(case.value, (Turn, SegmentCloseRequest), what="memory.turns event")
    row = case.stored
    assert isinstance(turn, Turn) and row is not None
    assert (turn.tenant, turn.conversation_id, turn.turn_id, turn.speaker, turn.text, turn.ts, turn.session_id,
            turn.metadata) == (row.tenant, row.conversation_id, row.turn_id, row.speaker, row.text, row.ts,
                               row.session_id, row.metadata)


def test_a_corrected_id_leaves_its_last_version():
    rows = expected_rows(CASES)
    assert [r.text for key, r in rows.items() if key[2] == "h-dup"] == ["the corrected version"]
