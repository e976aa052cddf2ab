"""Unit tests for epistream.client.sources (no services)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from epistream.client.sources import (
    detect_format,
    load_locomo,
    parse_evidence,
    parse_locomo_datetime,
    read_turns_jsonl,
)
from epistream.contracts.turns import Turn
from epistream.testing.datasets import locomo_dev

REPO = Path(__file__).resolve().parents[2]
LOCOMO_DEV = locomo_dev()
SAMPLE_CONVERSATION = REPO / "epistream/data/sample_conversation.jsonl"
SAMPLE_QUESTIONS = REPO / "epistream/data/sample_questions.json"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("10:37 am on 27 June, 2023", datetime(2023, 6, 27, 10, 37, tzinfo=UTC)),
        ("12:09 am on 13 September, 2023", datetime(2023, 9, 13, 0, 9, tzinfo=UTC)),
        ("12:30 PM on 1 Jan, 2024", datetime(2024, 1, 1, 12, 30, tzinfo=UTC)),
        ("  7:05pm on 3  March 2022 ", datetime(2022, 3, 3, 19, 5, tzinfo=UTC)),
    ],
)
def test_parse_locomo_datetime(text: str, expected: datetime) -> None:
    parsed = parse_locomo_datetime(text)
    assert parsed == expected
    assert parsed.tzinfo is not None


def test_parse_locomo_datetime_uses_given_zone() -> None:
    parsed = parse_locomo_datetime("1:56 pm on 8 May, 2023", ZoneInfo("Europe/Lisbon"))
    assert parsed.utcoffset() == timedelta(hours=1)
    fixed = parse_locomo_datetime("1:56 pm on 8 May, 2023", timezone(timedelta(hours=-5)))
    assert fixed.hour == 13 and fixed.utcoffset() == timedelta(hours=-5)


@pytest.mark.parametrize(
    "text",
    ["", "yesterday", "2023-05-08T13:56:00", "25:00 pm on 8 May, 2023", "1:56 pm on 31 February, 2023"],
)
def test_parse_locomo_datetime_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="LoCoMo date-time"):
        parse_locomo_datetime(text)


def test_parse_evidence_is_defensive() -> None:
    valid, rejected = parse_evidence(["D8:6; D9:17", "D", "D:11:26", " D1:3 ", "D2:4 D2:5"])
    assert valid == ["D8:6", "D9:17", "D1:3", "D2:4", "D2:5"]
    assert rejected == ["D", "D:11:26"]
    assert parse_evidence(None) == ([], [])


def _synthetic_locomo() -> list[dict]:
    conversation = {
        "speaker_a": "Ann",
        "speaker_b": "Ben",
        # Deliberately out of order and past 9, so lexicographic order would be wrong.
        "session_10": [
            {"speaker": "Ann", "dia_id": "D10:1", "text": "Back again!"},
            {"speaker": "Ben", "dia_id": "D10:2", "text": "Look at this.", "img_url": ["http://x/y.jpg"],
             "blip_caption": "a photo of a dog on a beach", "query": "dog beach"},
        ],
        "session_10_date_time": "9:00 am on 2 July, 2023",
        "session_2": [
            {"speaker": "Ann", "dia_id": "D2:1", "text": "Hi Ben"},
            {"speaker": "Ben", "dia_id": "D2:2", "text": "   "},
            {"speaker": "Ben", "dia_id": "D2:3", "text": "Hi Ann, how are you?"},
        ],
        "session_2_date_time": "1:56 pm on 8 May, 2023",
        # A date with no session (conv-26 in the real data has these): ignored.
        "session_11_date_time": "9:00 am on 3 July, 2023",
    }
    qa = [
        {"question": "What year?", "answer": 2022, "evidence": ["D2:1"], "category": 2},
        {"question": "Who?", "answer": "Ben", "evidence": ["D2:1; D10:2", "D", "D:11:26"], "category": 1},
        {"question": "Did Ann adopt a dog?", "adversarial_answer": "Yes", "evidence": ["D10:2"], "category": 5},
    ]
    return [{"sample_id": "s-1", "conversation": conversation, "qa": qa, "event_summary": {}}]


@pytest.fixture
def locomo_file(tmp_path: Path) -> Path:
    path = tmp_path / "mini-locomo.json"
    path.write_text(json.dumps(_synthetic_locomo()), encoding="utf-8")
    return path


def test_load_locomo_turns(locomo_file: Path) -> None:
    [sample] = load_locomo(locomo_file, tenant="t1", conversation_prefix="lc-")
    assert sample.sample_id == "s-1"
    assert sample.conversation_id == "lc-s-1"
    assert sample.skipped_turns == 1
    assert [t.turn_id for t in sample.turns] == ["D2:1", "D2:3", "D10:1", "D10:2"]
    assert [t.session_id for t in sample.turns] == ["session_2", "session_2", "session_10", "session_10"]
    start2 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    # The i-th entry of a session gets +i ms; the skipped entry keeps its slot.
    assert [t.ts for t in sample.turns[:2]] == [start2, start2 + timedelta(milliseconds=2)]
    assert sample.turns[2].ts == datetime(2023, 7, 2, 9, 0, tzinfo=UTC)
    assert all(a.ts < b.ts for a, b in zip(sample.turns, sample.turns[1:]))
    assert sample.turns[3].text == "Look at this. [shares an image: a photo of a dog on a beach]"
    first = sample.turns[0]
    assert (first.tenant, first.conversation_id, first.speaker) == ("t1", "lc-s-1", "Ann")
    assert first.metadata == {"source": "locomo", "sample_id": "s-1"}


def test_load_locomo_qa(locomo_file: Path) -> None:
    [sample] = load_locomo(locomo_file)
    assert sample.conversation_id == "s-1"
    year, who, adversarial = sample.qa
    assert year.answer == "2022" and year.category == 2 and year.evidence == ["D2:1"]
    assert who.evidence == ["D2:1", "D10:2"]
    assert sample.malformed_evidence == ["D", "D:11:26"]
    assert adversarial.answer is None
    assert adversarial.adversarial_answer == "Yes"
    assert adversarial.category == 5


def test_load_locomo_session_without_time(tmp_path: Path) -> None:
    data = _synthetic_locomo()
    del data[0]["conversation"]["session_2_date_time"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="session_2_date_time"):
        load_locomo(path)


def test_load_real_locomo_dev() -> None:
    if not LOCOMO_DEV.exists():
        pytest.skip(f"{LOCOMO_DEV} not present")
    samples = load_locomo(LOCOMO_DEV)
    assert [s.sample_id for s in samples] == ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]
    assert sum(len(s.qa) for s in samples) == 999
    for sample in samples:
        assert 369 <= len(sample.turns) <= 680
        assert len({t.turn_id for t in sample.turns}) == len(sample.turns)
        for turn in sample.turns:
            Turn.model_validate(turn.model_dump())
            assert Turn.from_bytes(turn.to_bytes()) == turn
        assert all(a.ts <= b.ts for a, b in zip(sample.turns, sample.turns[1:]))
        for qa in sample.qa:
            assert qa.category in {1, 2, 3, 4, 5}
            assert qa.answer is not None or qa.category == 5
            assert all(e.startswith("D") and ":" in e for e in qa.evidence)


def test_read_turns_jsonl_reports_bad_lines(tmp_path: Path) -> None:
    good = {
        "tenant": "t",
        "conversation_id": "c",
        "turn_id": "1",
        "speaker": "A",
        "text": "hi",
        "ts": "2024-01-01T00:00:00+00:00",
    }
    path = tmp_path / "turns.jsonl"
    path.write_bytes(
        json.dumps(good).encode() + b"\n"
        + b"\n"  # blank lines are skipped, not reported
        + b"{not json\n"
        + b"[1, 2]\n"
        + b"\xff\xfe\n"
        + json.dumps(good | {"turn_id": "2"}).encode()  # no trailing newline
    )
    rows = list(read_turns_jsonl(path))
    assert [n for n, _, _ in rows] == [1, 3, 4, 5, 6]
    assert rows[0] == (1, good, None)
    assert rows[1][1] is None and rows[1][2].startswith("invalid JSON")
    assert rows[2][1] is None and "expected a JSON object" in rows[2][2]
    assert rows[3][1] is None and rows[3][2].startswith("invalid UTF-8")
    assert rows[4][1]["turn_id"] == "2" and rows[4][2] is None


def test_sample_conversation_validates() -> None:
    rows = list(read_turns_jsonl(SAMPLE_CONVERSATION))
    assert all(error is None for _, _, error in rows)
    turns = [Turn.model_validate(value) for _, value, _ in rows]
    assert 60 <= len(turns) <= 80
    assert len({t.turn_id for t in turns}) == len(turns)
    assert {t.tenant for t in turns} == {"demo"}
    assert {t.conversation_id for t in turns} == {"demo-alice-bob"}
    assert {t.speaker for t in turns} == {"Alice", "Bob"}
    assert all(t.session_id for t in turns)
    assert all(a.ts < b.ts for a, b in zip(turns, turns[1:]))
    assert detect_format(SAMPLE_CONVERSATION) == "jsonl"


def test_sample_questions_shape() -> None:
    questions = json.loads(SAMPLE_QUESTIONS.read_text(encoding="utf-8"))
    assert len(questions) >= 6
    assert all(set(q) == {"question", "expected", "evidence"} for q in questions)
    assert any(q["expected"] is None for q in questions)
    # Each answerable question names the turns that hold its evidence (the demo's context test reads them).
    turn_ids = {data["turn_id"] for _, data, _ in read_turns_jsonl(SAMPLE_CONVERSATION) if data}
    assert all(bool(q["evidence"]) == (q["expected"] is not None) and set(q["evidence"]) <= turn_ids
               for q in questions)


def test_detect_format(tmp_path: Path, locomo_file: Path) -> None:
    assert detect_format(locomo_file) == "locomo"
    jsonl = tmp_path / "turns.jsonl"
    jsonl.write_text('{"conversation": 1}\n', encoding="utf-8")
    assert detect_format(jsonl) == "jsonl"
    other = tmp_path / "list.json"
    other.write_text('[{"turn_id": "1"}]', encoding="utf-8")
    assert detect_format(other) == "jsonl"
    broken = tmp_path / "broken.json"
    broken.write_text("{oops", encoding="utf-8")
    assert detect_format(broken) == "jsonl"
    empty = tmp_path / "empty.json"
    empty.write_text("[]", encoding="utf-8")
    assert detect_format(empty) == "jsonl"
