from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import Answer, RoleTokens
from epistream.contracts.turns import Turn
from epistream.messaging.dead_letters import build_dead_letter as dead_letter

TURN = {
    "tenant": "t1", "conversation_id": "c1", "turn_id": "D1:1", "speaker": "Caroline",
    "text": "I went to a support group yesterday.", "ts": "2023-05-08T13:56:00+00:00",
}


def test_turn_round_trips_through_bytes():
    turn = Turn.model_validate(TURN)
    assert Turn.from_bytes(turn.to_bytes()) == turn
    assert turn.ts.tzinfo is not None


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"ts": "2023-05-08T13:56:00"}, "timezone"),
        ({"text": ""}, "at least 1"),
        ({"text": "nul \x00 inside"}, "NUL"),
        ({"unexpected": 1}, "Extra inputs"),
        ({"tenant": None}, "tenant"),
    ],
)
def test_turn_rejects_bad_input_with_a_clear_reason(change, reason):
    with pytest.raises(ValidationError, match=reason):
        Turn.model_validate({**TURN, **change})


def test_turn_rejects_non_json_bytes():
    with pytest.raises(ValidationError):
        Turn.from_bytes(b"\xff\xfe not json")
    with pytest.raises(ValueError):
        Turn.from_bytes(None)


def test_question_defaults_to_auto_mode():
    q = Question.model_validate_json(json.dumps({"question_id": "q", "tenant": "t", "question": "when?"}))
    assert q.mode is Mode.AUTO and q.conversation_ids is None


def test_dead_letter_keeps_the_original_bytes():
    raw = b"\x00\x01 binary \xff"
    letter = dead_letter(topic="memory.turns", partition=2, offset=41, key=b"c1", value=raw, stage="ingest",
                         error=ValueError("boom"))
    again = DeadLetter.from_bytes(letter.to_bytes())
    assert again.original_value() == raw and again.original_key() == b"c1"
    assert (again.error_class, again.error_message, again.partition, again.offset) == ("ValueError", "boom", 2, 41)


def test_answer_serialises_tokens_per_role():
    answer = Answer(
        question_id="q", tenant="t", answer="x", abstained=False, evidence=[], mode=Mode.FAST, latency_ms=1.0,
        tokens={"master": RoleTokens(prompt=3, completion=2, calls=1)},
    )
    data = json.loads(answer.to_bytes())
    assert data["tokens"]["master"] == {"prompt": 3, "completion": 2, "calls": 1}
    assert Answer.from_bytes(answer.to_bytes()) == answer


def test_answer_times_are_aware():
    t = Turn.model_validate(TURN)
    assert t.ts == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


@pytest.mark.parametrize("topic", ["memory.answers", "answers.eval-1a2b_c", "a" * 249])
def test_question_reply_topic_takes_kafka_topic_names(topic):
    assert Question(question_id="q", tenant="t", question="why?", reply_topic=topic).reply_topic == topic


@pytest.mark.parametrize("topic", [".", "..", "has space", "slash/topic", "ünicode", "a" * 250, "colon:topic", ""])
def test_question_reply_topic_rejects_names_kafka_cannot_hold(topic):
    with pytest.raises(ValidationError, match="reply_topic"):
        Question(question_id="q", tenant="t", question="why?", reply_topic=topic)
