"""The answer worker's per-question policy, without services: every question ends in exactly one
outcome (an answer, a failed answer plus a dead letter, or a dead letter alone); only transient
errors wait, and giving up on them leaves the question unanswered for the next owner."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import psycopg
import pytest

from epistream.consumers import outcome as worker
from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import Answer
from epistream.core.claims import ClaimCheck
from epistream.core.metrics import Metrics
from epistream.messaging.kafka_io import TopicDirectory
from epistream.settings.processes import Settings

SETTINGS = Settings()


def _deps():
    return SimpleNamespace(settings=SETTINGS, metrics=Metrics.create())


def _record(value: bytes, offset: int = 7):
    return SimpleNamespace(topic=SETTINGS.topic_questions, partition=0, offset=offset, key=b"q1", value=value, headers=())


def _question(**fields) -> bytes:
    return Question(question_id="q1", tenant="t", question="Where?", mode=Mode.FAST, **fields).to_bytes()


def _topics(*names: str) -> TopicDirectory:
    async def listed() -> set[str]:
        return set(names)
    return TopicDirectory(listed)


def _run(record, monkeypatch, answer, *, topics=None, give_up=lambda: False):
    monkeypatch.setattr(worker, "answer_question", answer)
    return asyncio.run(worker.outcome_of(record, _deps(), topics or _topics(), claims=ClaimCheck.from_settings(SETTINGS),
                                         give_up=give_up))


def test_an_unexpected_error_is_a_failed_answer_and_a_dead_letter(monkeypatch):
    async def broken(question, deps, steps=None):
        raise KeyError("a bug")

    outcome = _run(_record(_question()), monkeypatch, broken)
    (answer_topic, key, value, _), (dlq_topic, _, letter, _) = outcome.messages
    answer = Answer.from_bytes(value)
    assert (answer_topic, key, dlq_topic) == (SETTINGS.topic_answers, b"q1", SETTINGS.topic_dlq)
    assert answer.abstained and answer.error.startswith("KeyError") and "failed" in answer.answer
    assert DeadLetter.model_validate_json(letter).error_class == "KeyError"


def test_an_undecodable_question_is_only_dead_lettered(monkeypatch):
    outcome = _run(_record(b"[" * 100_000), monkeypatch, None)
    assert [m.topic for m in outcome.messages] == [SETTINGS.topic_dlq] and outcome.answer is None


def test_an_unknown_reply_topic_fails_to_the_default_topic_without_answering(monkeypatch):
    async def never(question, deps, steps=None):
        raise AssertionError("answered a question whose reply topic is unknown")

    outcome = _run(_record(_question(reply_topic="nobody.listens")), monkeypatch, never)
    (answer_topic, _, value, _), (_, _, letter, _) = outcome.messages
    assert answer_topic == SETTINGS.topic_answers and Answer.from_bytes(value).error.startswith("UnknownReplyTopic")
    assert DeadLetter.model_validate_json(letter).error_class == "UnknownReplyTopic"


def test_a_known_reply_topic_gets_the_answer(monkeypatch):
    async def fine(question, deps, steps=None):
        return worker.failed_answer(question, RuntimeError("stand-in answer"), 0.0)

    outcome = _run(_record(_question(reply_topic="eval.replies")), monkeypatch, fine, topics=_topics("eval.replies"))
    assert [m.topic for m in outcome.messages] == ["eval.replies"]


def test_a_transient_error_given_up_on_leaves_the_question_for_the_next_owner(monkeypatch):
    async def database_down(question, deps, steps=None):
        raise psycopg.OperationalError("connection refused")

    assert _run(_record(_question()), monkeypatch, database_down, give_up=lambda: True) is None


@pytest.mark.parametrize(("age", "listed"), [(0.0, 1), (61.0, 2)])
def test_the_topic_directory_caches_known_topics_and_refreshes_on_a_miss(age, listed):
    calls, now = [], [0.0]

    async def topics() -> set[str]:
        calls.append(now[0])
        return {"a"}

    async def go():
        directory = TopicDirectory(topics, max_age_s=60.0, clock=lambda: now[0])
        assert await directory.exists("a")
        now[0] = age
        assert await directory.exists("a")
        assert not await directory.exists("b")  # a miss always asks the broker again
        return len(calls)

    assert asyncio.run(go()) == listed + 1


def test_an_answer_over_the_message_limit_is_sent_with_the_evidence_that_fits(monkeypatch):
    """An answer Kafka would refuse fails its send on every retry: the worker sends what fits instead."""
    from datetime import UTC, datetime

    from epistream.contracts.replies import Evidence

    async def verbose(question, deps, steps=None):
        quote = "q" * 300_000
        evidence = [Evidence(conversation_id="c", turn_ids=[f"t{i}"], quote=quote, time=datetime.now(UTC))
                    for i in range(5)]
        return worker.failed_answer(question, RuntimeError("x"), 0.0).model_copy(
            update={"answer": "Lisbon.", "error": None, "abstained": False, "evidence": evidence})

    outcome = _run(_record(_question()), monkeypatch, verbose)
    ((topic, key, value, _),) = outcome.messages
    answer = Answer.from_bytes(value)
    assert topic == SETTINGS.topic_answers and len(value) < 1_000_000
    assert answer.answer == "Lisbon." and [e.turn_ids for e in answer.evidence] == [["t0"], ["t1"], ["t2"]]


def test_an_answer_read_after_positions_not_stored_in_time_says_it_is_incomplete(monkeypatch):
    waited: list[tuple] = []

    async def gave_up(pool, topic, positions, *, timeout_s, metrics, log=None):
        waited.append((topic, [p.offset for p in positions], timeout_s))
        return "not stored within 5s: c@0:9; the read may miss those turns"

    async def fine(question, deps, steps=None):
        assert waited, "read before waiting for the positions"
        return worker.failed_answer(question, RuntimeError("stand-in answer"), 0.0)

    monkeypatch.setattr(worker, "read_after", gave_up)
    deps = SimpleNamespace(settings=SETTINGS, metrics=Metrics.create(), pool=None, read_pool=None,
                           turns_log=None)
    monkeypatch.setattr(worker, "answer_question", fine)
    record = _record(_question(after=[{"conversation_id": "c", "partition": 0, "offset": 9}]))
    outcome = asyncio.run(worker.outcome_of(record, deps, _topics(), claims=ClaimCheck.from_settings(SETTINGS),
                                            give_up=lambda: False))
    answer = Answer.from_bytes(outcome.messages[0][2])
    assert answer.incomplete == "not stored within 5s: c@0:9; the read may miss those turns"
    assert waited == [(SETTINGS.topic_turns, [9], SETTINGS.read_after_timeout_s)]
