"""Progress of `ask` as pure logic: the `Progress` contract round trip and its key and header (never a
reply's); the worker's `Steps` (nothing for a question that did not ask; counted up in order, aimed at
the reply's topic and partition); the client's routing (each record before the reply handed over in
order, nothing left registered after the call); the MCP side's forwarding (strictly increasing values,
step names only, nothing without a token)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from epistream.apps.mcp import progress as mcp_progress
from epistream.client.replies import PROGRESS_BACKLOG, ReplyRouter, reply_with_progress
from epistream.client.session import _decoded
from epistream.consumers.progress import Steps
from epistream.contracts.base import RECORD_HEADER
from epistream.contracts.decoding import decode
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import (
    PROGRESS_RECORD,
    Answer,
    MemoryContext,
    Progress,
    ProgressStep,
    is_progress,
    progress_key,
)
from epistream.errors import ContractError
from epistream.messaging.kafka_io import Outgoing

SECRET_QUESTION = "Where does Ines keep her tortoise Quasimodo?"


def _question(**fields) -> Question:
    return Question(question_id="q1", tenant="t", question=SECRET_QUESTION, mode=Mode.DEEP, **fields)


def _steps(question: Question) -> tuple[Steps, list[Outgoing]]:
    sent: list[Outgoing] = []
    return Steps.of(question, sent.append), sent


# -- the contract --

def test_a_progress_record_round_trips_and_is_no_reply():
    record = Progress(question_id="q1", seq=3, step=ProgressStep.ASSISTANT_READ, mode=Mode.DEEP, done=2, total=5)
    assert Progress.from_bytes(record.to_bytes()) == record
    assert decode(record.to_bytes(), (MemoryContext, Progress), what="reply").kind == "progress"
    with pytest.raises(ContractError):  # a reader that takes every record for an Answer refuses it
        decode(record.to_bytes(), Answer, what="answer")
    assert record.describe() == "deep: assistant read 2/5"


def test_a_progress_key_is_never_a_question_ids_and_the_header_marks_it():
    assert progress_key("q1") != b"q1" and progress_key("q1").startswith(b"q1")
    with pytest.raises(ValueError, match="NUL"):  # a question id cannot end like a progress key
        Question(question_id="q1\x00progress", tenant="t", question="?")
    assert is_progress([("traceparent", b"00-x"), (RECORD_HEADER, PROGRESS_RECORD)])
    assert not is_progress(None) and not is_progress([]) and not is_progress([(RECORD_HEADER, b"reply")])


def test_a_question_without_progress_is_the_same_bytes_as_before():
    assert b"progress" not in _question().to_bytes()
    assert Question.from_bytes(_question(progress=True).to_bytes()).progress is True


# -- the worker's steps --

def test_a_question_that_did_not_ask_reports_nothing():
    steps, sent = _steps(_question())
    steps.aim("memory.answers", 3)
    steps.started(Mode.DEEP)
    steps.report(ProgressStep.MASTER_CALL)
    assert sent == []


def test_steps_count_up_in_order_on_the_replys_topic_and_partition():
    steps, sent = _steps(_question(progress=True))
    steps.report(ProgressStep.RETRIEVED, total=2)  # not aimed yet: the reply's destination is not known
    steps.aim("memory.answers.acme", 3)
    steps.started(Mode.DEEP)
    steps.report(ProgressStep.RETRIEVED, total=2)
    for done in (1, 2):
        steps.report(ProgressStep.ASSISTANT_READ, done=done, total=2)
    steps.report(ProgressStep.MASTER_CALL)
    records = [Progress.from_bytes(r.value) for r in sent]
    assert [(r.seq, r.step) for r in records] == [
        (1, ProgressStep.MODE), (2, ProgressStep.RETRIEVED), (3, ProgressStep.ASSISTANT_READ),
        (4, ProgressStep.ASSISTANT_READ), (5, ProgressStep.MASTER_CALL)]
    assert {(r.topic, r.partition, r.key) for r in sent} == {("memory.answers.acme", 3, progress_key("q1"))}
    assert all(r.mode is Mode.DEEP for r in records)
    assert not any(SECRET_QUESTION.encode() in r.value for r in sent)  # names and counts, never the text


def test_a_step_that_does_not_fit_its_contract_is_not_sent_and_does_not_raise():
    steps, sent = _steps(_question(progress=True))
    steps.aim("memory.answers", None)
    steps.report(ProgressStep.TOOL_CALL, done=1, total=3, tool="Not A Tool Name")
    steps.report(ProgressStep.TOOL_CALL, done=1, total=3, tool="search_turns")
    assert [Progress.from_bytes(r.value).seq for r in sent] == [1]


# -- the client's routing --

async def test_progress_before_the_reply_is_handed_over_in_order_then_the_reply():
    router, seen = ReplyRouter(), []
    future, updates = router.expect(b"q1"), router.listen(progress_key("q1"))

    async def hand_over(raw: bytes) -> None:
        seen.append(raw)
        await asyncio.sleep(0)  # a callback that awaits (the MCP server's notification)

    waiting = asyncio.create_task(reply_with_progress(future, updates, hand_over))
    router.progress(progress_key("q1"), b"1")
    await asyncio.sleep(0.01)
    assert seen == [b"1"]
    # The rest come in one fetch with the reply: those before it are still handed over, first.
    assert router.progress(progress_key("q1"), b"2") and router.progress(progress_key("q1"), b"3")
    assert router.deliver(b"q1", b"reply")
    assert await waiting == b"reply" and seen == [b"1", b"2", b"3"]


async def test_progress_is_never_delivered_as_a_reply_nor_to_another_call():
    router = ReplyRouter()
    future, updates = router.expect(b"q1"), router.listen(progress_key("q1"))
    assert not router.deliver(progress_key("q1"), b"{}")  # a progress key never matches a waiting reply
    assert not router.progress(progress_key("q2"), b"{}") and not router.progress(b"q1", b"{}")
    assert not future.done() and updates.empty()


async def test_a_full_backlog_drops_progress_not_the_reply():
    router = ReplyRouter()
    future, updates = router.expect(b"q1"), router.listen(progress_key("q1"))
    accepted = [router.progress(progress_key("q1"), b"%d" % n) for n in range(PROGRESS_BACKLOG + 5)]
    assert accepted.count(False) == 5 and router.deliver(b"q1", b"reply") and future.result() == b"reply"
    assert updates.qsize() == PROGRESS_BACKLOG


async def test_a_cancelled_wait_leaves_nothing_registered():
    router = ReplyRouter()
    key, listening = b"q1", progress_key("q1")
    future, updates = router.expect(key), router.listen(listening)

    async def never(raw: bytes) -> None:
        raise AssertionError("no progress came")

    waiting = asyncio.create_task(reply_with_progress(future, updates, never))
    await asyncio.sleep(0.01)
    waiting.cancel()  # the MCP client cancelled: the handler's task is cancelled
    with pytest.raises(asyncio.CancelledError):
        await waiting
    router.discard(key, future)  # what EpistreamClient._request's finally does
    router.unlisten(listening, updates)
    assert len(router) == 0 and router.listening == 0
    assert not router.deliver(key, b"late") and not router.progress(listening, b"late")


async def test_a_failing_callback_is_called_once_and_a_bad_record_skipped():
    calls = []

    async def broken(update: Progress) -> None:
        calls.append(update.seq)
        raise RuntimeError("the MCP stream is gone")

    hand_over = _decoded(broken)
    good = Progress(question_id="q1", seq=1, step=ProgressStep.MODE, mode=Mode.FAST).to_bytes()
    await hand_over(b"not json")
    await hand_over(good)
    await hand_over(good)
    assert calls == [1]


# -- the MCP side --

class _Context:
    """What the forwarder reads and calls of the SDK's Context: its request's meta, report_progress."""

    def __init__(self, meta: dict | None) -> None:
        self.request_context = SimpleNamespace(meta=meta)
        self.reported: list[tuple[float, float | None, str | None]] = []

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        self.reported.append((progress, total, message))


async def test_without_a_progress_token_an_ask_asks_for_no_progress():
    assert mcp_progress.forwarder(None) is None
    assert mcp_progress.forwarder(_Context({"io.modelcontextprotocol/protocolVersion": "2026-07-28"})) is None
    assert mcp_progress.forwarder(_Context({"progress_token": True})) is None  # a bool is no token


async def test_forwarded_progress_strictly_increases_even_when_the_worker_counts_again():
    context = _Context({"progress_token": 7})
    forward = mcp_progress.forwarder(context)
    assert forward is not None
    for seq, step in [(1, ProgressStep.MODE), (2, ProgressStep.RETRIEVED), (1, ProgressStep.MODE),  # answered again
                      (2, ProgressStep.MASTER_CALL)]:
        await forward(Progress(question_id="q1", seq=seq, step=step, mode=Mode.FAST, total=4))
    assert [value for value, _, _ in context.reported] == [1, 2, 3, 4]
    assert [message for _, _, message in context.reported] == [
        "answering in fast mode", "fast: 4 item(s) of memory found", "answering in fast mode",
        "fast: the master model answers"]


# -- the modes' steps, and the worker's sending --

async def test_an_agentic_answer_reports_each_tool_the_master_calls():
    from epistream.consumers.modes import agentic
    from epistream.models.llm import Usage
    from epistream.settings.processes import Settings

    calls = iter([agentic.AgentStep(tool="output_answer", arguments={"abstain": "perhaps"}),  # refused, told back
                  agentic.AgentStep(tool="output_answer", arguments={"answer": "Braga", "abstain": True})])

    async def complete_json(messages, schema, max_tokens):
        return SimpleNamespace(value=next(calls), usage=Usage())

    deps = SimpleNamespace(settings=Settings(agentic_max_steps=3, llm_tools_api=False),
                           master=SimpleNamespace(complete_json=complete_json))
    question = _question(progress=True).model_copy(update={"mode": Mode.AGENTIC})
    steps, sent = _steps(question)
    steps.aim("memory.answers", 0)
    await agentic.answer_agentic(question, deps, steps)
    assert [Progress.from_bytes(r.value).describe() for r in sent] == [
        "agentic: step 1/3: output_answer", "agentic: step 2/3: output_answer"]


async def test_the_progress_sink_never_blocks_and_drops_past_its_queue(monkeypatch):
    from epistream.consumers import progress as worker_progress
    from epistream.settings.processes import Settings

    started = asyncio.Event()

    class Unreachable:  # a broker that never answers: the producer's start hangs
        async def start(self) -> None:
            started.set()
            await asyncio.Event().wait()

        async def stop(self) -> None:
            pass

    monkeypatch.setattr(worker_progress, "create_producer", lambda *args, **kwargs: Unreachable())
    monkeypatch.setattr(worker_progress, "QUEUE_MAX", 3)
    sink = worker_progress.ProgressSink(Settings())
    for n in range(5):
        sink(Outgoing("memory.answers", progress_key("q1"), b"%d" % n, 0))  # returns at once, every time
    await asyncio.wait_for(started.wait(), 5)
    assert sink.dropped == 2
    await asyncio.wait_for(sink.close(), 5)
    assert sink.dropped == 5  # what was still queued at the stop is gone: progress is best effort
