"""Records that used to escape the per-record path (issue 11, defects 1 and 8): each must become a
ContractError with a reason, and every dead letter must fit in one Kafka message."""

from __future__ import annotations

import json

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.decoding import decode
from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.errors import ContractError
from epistream.messaging.dead_letters import DEFAULT_MAX_REQUEST_SIZE, build_dead_letter, letter_key

TURN = {
    "tenant": "t1", "conversation_id": "c1", "turn_id": "D1:1", "speaker": "Caroline",
    "text": "I went to a support group yesterday.", "ts": "2023-05-08T13:56:00+00:00",
    "session_id": "s1",
}
CLOSE = {"kind": "segment_close", "tenant": "t1", "conversation_id": "c1", "after_turn_id": "D1:1"}
WHAT = "memory.turns event"


def reason_of(raw: bytes) -> str:
    with pytest.raises(ContractError) as caught:
        decode(raw, (Turn, SegmentCloseRequest), what=WHAT)
    return str(caught.value)


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_metadata_nested_thousands_of_levels_is_a_contract_error_not_a_recursion_error():
    raw = json.dumps(TURN)[:-1] + ', "metadata": ' + nested(5000) + "}"
    assert "nested too deeply" in reason_of(raw.encode())


def test_metadata_deeper_than_the_contract_allows_is_refused_even_when_json_can_parse_it():
    raw = json.dumps(TURN)[:-1] + ', "metadata": ' + nested(100) + "}"
    assert "metadata" in reason_of(raw.encode()) and "deep" in reason_of(raw.encode())


@pytest.mark.parametrize("field", ["tenant", "conversation_id", "turn_id", "speaker", "text", "session_id"])
def test_a_nul_in_any_turn_field_is_refused_with_a_reason(field):
    text = reason_of(json.dumps({**TURN, field: "a\x00b"}).encode())
    assert field in text and "NUL" in text


@pytest.mark.parametrize("field", ["tenant", "conversation_id", "after_turn_id"])
def test_a_nul_in_a_close_request_is_refused(field):
    assert "NUL" in reason_of(json.dumps({**CLOSE, field: "a\x00b"}).encode())


@pytest.mark.parametrize("metadata", [{"k\x00": 1}, {"k": ["x\x00"]}, {"k": {"deep": "\x00"}}])
def test_a_nul_anywhere_in_metadata_is_refused(metadata):
    assert "NUL" in reason_of(json.dumps({**TURN, "metadata": metadata}).encode())


def test_non_finite_numbers_and_lone_surrogates_which_postgresql_cannot_store_are_refused():
    assert "finite" in reason_of(json.dumps({**TURN, "metadata": {"x": float("nan")}}).encode())
    assert "unicode" in reason_of(json.dumps({**TURN, "text": "half \ud800 a pair"}).encode())


@pytest.mark.parametrize("ts", ["0001-01-01T00:00:00+14:00", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59-10:00",
                                "9999-12-31T12:00:00Z"])
def test_instants_outside_what_postgresql_and_python_both_round_trip_are_refused(ts):
    assert "ts" in reason_of(json.dumps({**TURN, "ts": ts}).encode())


@pytest.mark.parametrize("ts", ["0001-01-03T00:00:00+14:00", "9999-12-29T23:59:59-14:00"])
def test_instants_just_inside_the_range_are_kept(ts):
    assert decode(json.dumps({**TURN, "ts": ts}).encode(), Turn, what=WHAT).ts.year in (1, 9999)


def test_values_that_are_not_utf8_are_refused_and_a_utf8_bom_is_tolerated():
    assert "utf-8" in reason_of(json.dumps(TURN).encode("utf-16"))
    assert "JSON" in reason_of(json.dumps(TURN).encode("utf-16-le"))
    assert decode(b"\xef\xbb\xbf" + json.dumps(TURN).encode(), Turn, what=WHAT).turn_id == "D1:1"


# --- dead letters always fit (defect 8) ---

def record_size(key: bytes | None, letter: DeadLetter) -> int:
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, letter.to_bytes(), [])


@pytest.mark.parametrize("size", [760_000, 999_000, 1_048_000])
def test_a_letter_for_an_oversized_record_fits_under_the_producer_limit(size):
    value = b"\xff" + b"x" * (size - 1)
    letter = build_dead_letter(topic="memory.turns", partition=0, offset=7, key=b"conv", value=value,
                               stage="ingest", error=ContractError("not a valid memory.turns event: invalid JSON"))
    assert record_size(letter_key(b"conv"), letter) <= DEFAULT_MAX_REQUEST_SIZE
    assert letter.value_truncated and letter.value_size == size
    import hashlib

    assert letter.value_sha256 == hashlib.sha256(value).hexdigest()
    kept = letter.original_value()
    assert kept is not None and value.startswith(kept) and len(kept) > 700_000


def test_a_small_letter_is_whole_and_still_carries_its_hash_and_size():
    letter = build_dead_letter(topic="memory.turns", partition=0, offset=7, key=b"conv", value=b"{bad",
                               stage="ingest", error=ValueError("x"))
    assert not letter.value_truncated and letter.original_value() == b"{bad" and letter.value_size == 4


def test_a_huge_key_is_truncated_too_and_the_letter_is_keyed_by_its_hash():
    key, value = b"k" * 800_000, b"v" * 150_000
    letter = build_dead_letter(topic="memory.turns", partition=0, offset=7, key=key, value=value,
                               stage="ingest", error=ValueError("x"), max_request_size=1_000_000)
    assert record_size(letter_key(key), letter) <= 1_000_000
    assert letter.value_truncated and letter.key_truncated and len(letter_key(key)) == 64
    assert letter.key_size == 800_000
