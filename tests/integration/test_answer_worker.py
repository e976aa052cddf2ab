"""The answer worker process against questions that used to stop it, and its exactly-once promise.

The worker runs on its own topics (one question partition, so "the next question" is on the same
partition), consumer group and database, with its master pointed at a scripted OpenAI-compatible
server. Answers are read as the product's readers read them: read_committed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from epistream.client.api import produce_raw
from epistream.contracts.questions import Mode, Question
from epistream.infra.process import ManagedProcess, pid_alive
from epistream.messaging.kafka_io import create_consumer
from epistream.settings.processes import Settings
from epistream.storage.db import APP_ROLE, admin_database_url

from .answer_env import AnswerEnv, scripted_answer_env

pytestmark = pytest.mark.integration

# The master calls a tool that reads the turns (see the tests for what it meets there).
TRAP = "TOOL-TRAP"
SLOW = "SLOW-QUESTION"  # the first master call for it blocks until the test releases it


class Master:
    """The scripted agentic master: one tool call per step, as JSON."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.slow_calls = 0
        self.slow_started = threading.Event()

    def __call__(self, body: dict) -> tuple[int, str]:
        text = json.dumps(body["messages"])
        if TRAP in text and "Result of lexical_retrieve" not in text:
            return 200, json.dumps({"tool": "lexical_retrieve", "arguments": {"query": "ferry boat", "target": "turns"}})
        if SLOW in text:
            self.slow_calls += 1
            if self.slow_calls == 1:
                self.slow_started.set()
                self.release.wait(timeout=120)
        return 200, json.dumps({"tool": "output_answer", "arguments": {"answer": "", "abstain": True}})


@pytest.fixture(scope="module")
def answer_env(kafka) -> Iterator[AnswerEnv]:
    with scripted_answer_env(kafka, Master(), "answers", partitions=1) as env:
        yield env


@pytest.fixture(scope="module")
def worker(answer_env) -> Iterator[ManagedProcess]:
    process = answer_env.spawn(0)
    try:
        yield process
    finally:
        process.stop()


def _question(qid: str, text: str, **fields) -> Question:
    return Question(question_id=qid, tenant="tenant-a", question=text, **fields)


def _alive(process: ManagedProcess) -> bool:
    pid = process.pid()
    return pid is not None and pid_alive(pid)


def test_a_question_at_the_end_of_the_calendar_is_answered_and_the_worker_keeps_going(answer_env, worker, unique):
    pid = worker.pid()
    qid = unique("q-9999")
    answer_env.ask(_question(qid, "What did I do this year?", mode=Mode.DEEP,
                             asked_at=datetime(9999, 12, 31, tzinfo=UTC)))
    answers = answer_env.answers(qid)
    assert len(answers) == 1 and answers[0].error is None and answers[0].abstained  # an empty memory
    assert worker.pid() == pid and _alive(worker)


def _memory_readable(settings: Settings, readable: bool) -> None:
    """Grant or revoke the application role's reads on the memory tables of this test's own database."""
    verb = "GRANT SELECT ON memory.gists, memory.turns TO {}" if readable else \
        "REVOKE SELECT ON memory.gists, memory.turns FROM {}"
    with psycopg.connect(admin_database_url(settings), autocommit=True) as conn:
        conn.execute(sql.SQL(verb).format(sql.Identifier(APP_ROLE)))


def _unreadable_turn(settings: Settings, present: bool) -> None:
    """A row another writer left (the contracts refuse it today): its instant, `infinity`, is one
    psycopg cannot read back, so any read that meets it raises DataError, neither ours nor transient."""
    with psycopg.connect(admin_database_url(settings), autocommit=True) as conn:
        if present:
            conn.execute("INSERT INTO memory.turns (tenant, conversation_id, turn_id, speaker, text, ts, tz_offset_s,"
                         " embedding) VALUES ('tenant-a', 'left-behind', 't1', 'Maya', 'the ferry boat timetable',"
                         " 'infinity', 0, %s::vector)", (str([1.0] + [0.0] * 383),))
        else:
            conn.execute("DELETE FROM memory.turns WHERE conversation_id = 'left-behind'")


def test_a_question_that_trips_an_unexpected_error_is_answered_failed_once_and_the_next_one_answered(
        answer_env, worker, unique):
    pid = worker.pid()
    trap, after = unique("q-trap"), unique("q-after")
    _unreadable_turn(answer_env.settings, True)
    try:
        answer_env.ask(_question(trap, f"{TRAP}: which ferry?", mode=Mode.AGENTIC))
        failed = answer_env.answers(trap)
    finally:
        _unreadable_turn(answer_env.settings, False)
    answer_env.ask(_question(after, "Which ferry did Maya take?", mode=Mode.AGENTIC))
    answered = answer_env.answers(after)
    assert len(answered) == 1 and answered[0].error is None
    failed = answer_env.answers(trap, want=2, timeout=5)  # the one answer, and time for a second to show up
    assert len(failed) == 1 and failed[0].abstained and failed[0].error.startswith("DataError")
    letters = answer_env.letters(trap)
    assert [(letter.stage, letter.error_class) for letter in letters] == [("answer", "DataError")]
    assert Question.from_bytes(letters[0].original_value()).question_id == trap
    assert worker.pid() == pid and _alive(worker)


def test_a_question_that_meets_an_error_no_question_can_cause_waits_and_is_answered_once_it_clears(
        answer_env, worker, unique):
    """A lost privilege fails every question alike: the worker waits for the operator (errors.is_transient)
    rather than answer each one failed, and answers it once the grant is back."""
    pid = worker.pid()
    waiting = unique("q-waits")
    _memory_readable(answer_env.settings, False)
    try:
        answer_env.ask(_question(waiting, f"{TRAP}: which ferry?", mode=Mode.AGENTIC))
        assert answer_env.answers(waiting, want=1, timeout=8) == []  # held, not failed
    finally:
        _memory_readable(answer_env.settings, True)
    answered = answer_env.answers_then_quiet(waiting, timeout=60)
    assert len(answered) == 1 and answered[0].error is None
    assert answer_env.letters(waiting, timeout=3) == []
    assert worker.pid() == pid and _alive(worker)


def test_an_unknown_reply_topic_is_dead_lettered_and_never_created(answer_env, worker, unique):
    qid, after = unique("q-reply"), unique("q-reply-after")
    missing = f"answers-{answer_env.suffix}.nobody-{qid}"
    answer_env.ask(_question(qid, "Who took the ferry?", mode=Mode.AGENTIC, reply_topic=missing))
    answer_env.ask(_question(after, "Who took the ferry?", mode=Mode.AGENTIC))
    assert len(answer_env.answers(after)) == 1
    failed = answer_env.answers(qid)
    assert len(failed) == 1 and failed[0].abstained and failed[0].error.startswith("UnknownReplyTopic")
    assert [letter.error_class for letter in answer_env.letters(qid)] == ["UnknownReplyTopic"]
    assert missing not in asyncio.run(_topics(answer_env.settings))
    assert _alive(worker)


def test_a_question_with_an_illegal_reply_topic_is_dead_lettered(answer_env, worker, unique):
    qid = unique("q-illegal")
    value = json.loads(_question(qid, "Who?").to_bytes()) | {"reply_topic": "no such/topic"}
    asyncio.run(produce_raw(answer_env.settings, [(qid.encode(), json.dumps(value).encode())],
                            topic=answer_env.settings.topic_questions))
    letters = answer_env.letters(qid)
    assert letters[0].error_class == "ContractError" and "reply_topic" in letters[0].error_message
    assert answer_env.answers(qid, timeout=3) == []
    assert _alive(worker)


async def _topics(settings: Settings) -> set[str]:
    consumer = create_consumer(settings)
    await consumer.start()
    try:
        return await consumer.topics()
    finally:
        await consumer.stop()


def test_a_paused_worker_that_lost_its_question_never_answers_it_twice(answer_env, worker, unique):
    """The first worker holds the question in its model call and is paused past its session; a second
    worker takes the partition over and answers; the first resumes, finishes, and is fenced: the question
    is answered once, and both workers stay up. Then the second is killed -9 mid-question: answered once."""
    qid = unique("q-slow")
    answer_env.ask(_question(qid, f"{SLOW}: what happened?", mode=Mode.AGENTIC))
    assert answer_env.master.slow_started.wait(90), "the first worker never asked the master"
    os.kill(worker.pid(), signal.SIGSTOP)
    second = None
    try:
        second = answer_env.spawn(1)  # joins the group; the paused one is expelled when its session expires
        assert len(answer_env.answers(qid, timeout=120)) == 1
    finally:
        answer_env.master.release.set()
        os.kill(worker.pid(), signal.SIGCONT)
    try:
        # The resumed worker sends its (late) answer: fenced, so never committed.
        assert len(answer_env.answers_then_quiet(qid, timeout=30)) == 1
        assert _alive(worker) and _alive(second)

        killed = unique("q-killed")
        answer_env.master.release.clear()
        answer_env.master.slow_calls = 0
        answer_env.master.slow_started.clear()
        answer_env.ask(_question(killed, f"{SLOW}: and then?", mode=Mode.AGENTIC))
        assert answer_env.master.slow_started.wait(90)
        for process in (worker, second):  # whichever holds it now, kill -9 both mid-question
            os.kill(process.pid(), signal.SIGKILL)
        answer_env.master.release.set()
        third = answer_env.spawn(2)
        try:
            assert len(answer_env.answers_then_quiet(killed, timeout=60)) == 1
        finally:
            third.stop()
    finally:
        if second is not None:
            second.stop()
