"""The concurrent answer worker keeps exactly-once: reads are answered while model calls before them
hang, and every question is answered once for a read_committed reader when a worker is killed with
questions in flight or loses partitions to another worker (docs/design.md#the-answer-worker).

Real worker processes, a real broker and database; the model is the scripted OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from epistream.contracts.positions import Position
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import MemoryContext
from epistream.infra.process import ManagedProcess, pid_alive

from .answer_env import AnswerEnv, scripted_answer_env

pytestmark = pytest.mark.integration

HANG = "HANG-UNTIL-RELEASED"  # a model call for such a question blocks until the test releases it


class Master:
    """The agentic master: answers at once, except for questions marked HANG while not released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.hanging = 0
        self.lock = threading.Lock()
        self.hung = threading.Event()

    def __call__(self, body: dict) -> tuple[int, str]:
        if HANG in json.dumps(body["messages"]) and not self.release.is_set():
            with self.lock:
                self.hanging += 1
            self.hung.set()
            self.release.wait(timeout=180)
        return 200, json.dumps({"tool": "output_answer", "arguments": {"answer": "scripted", "abstain": False}})


def _read(qid: str, **fields) -> Question:
    return Question(question_id=qid, tenant="tenant-a", question="Where did Maya go?", mode=Mode.CONTEXT, **fields)


def _listing(qid: str) -> Question:
    return Question(question_id=qid, tenant="tenant-a", question="timeline", mode=Mode.CONTEXT, listing="timeline",
                    conversation_ids=["c1"])


def _model(qid: str, *, hang: bool = False) -> Question:
    return Question(question_id=qid, tenant="tenant-a", question=f"{HANG if hang else 'Plain'}: where did Maya go?",
                    mode=Mode.AGENTIC)


def _reply_counts(env: AnswerEnv, ids: set[str], *, timeout: float) -> Counter[str]:
    """How many committed replies each of `ids` has: read until there are as many as questions, then a
    few seconds more for any second reply."""
    keys = {i.encode() for i in ids}
    env.replies(lambda k, v: k in keys, want=len(ids), timeout=timeout)
    found = env.replies(lambda k, v: k in keys, want=len(ids) + 1, timeout=5)
    return Counter(r.key.decode() for r in found)


def _kill(process: ManagedProcess) -> None:
    pid = process.pid()
    if pid is not None and pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def one_partition(kafka) -> Iterator[AnswerEnv]:
    with scripted_answer_env(kafka, Master(), "concurrent", partitions=1) as env:
        yield env


@pytest.fixture
def two_partitions(kafka) -> Iterator[AnswerEnv]:
    with scripted_answer_env(kafka, Master(), "rebalance", partitions=2, port_offset=5) as env:
        yield env


def test_reads_behind_a_hung_model_call_are_answered_and_never_answered_again_after_a_kill(one_partition, unique):
    """One partition: the reads sit behind a question whose model call hangs. They are answered (and
    committed past it, in the commit's metadata) while it hangs; positions no wait can meet are named
    at once; the worker killed -9 with the hung question open, the next one answers that question only."""
    env = one_partition
    first = env.spawn(0)
    hung, read, listing = unique("q-hung"), unique("q-read"), unique("q-listing")
    no_partition, far_offset = unique("q-nopart"), unique("q-far")
    try:
        env.ask(_model(hung, hang=True))
        assert env.master.hung.wait(90), "the worker never asked the master"
        env.ask(_read(read), _listing(listing),
                _read(no_partition, after=[Position(conversation_id="c1", partition=99, offset=0)]),
                _read(far_offset, after=[Position(conversation_id="c1", partition=0, offset=10**9)]))
        for qid in (read, listing):
            replies = env.replies(lambda k, v, q=qid: k == q.encode(), want=1, timeout=30)
            assert len(replies) == 1
        named = {q: MemoryContext.from_bytes(env.replies(lambda k, v, q=q: k == q.encode(), want=1, timeout=30)[0].value)
                 for q in (no_partition, far_offset)}
        assert "no partition 99" in (named[no_partition].incomplete or "")
        assert "ends at" in (named[far_offset].incomplete or "")
        assert not env.master.release.is_set() and env.answers(hung, timeout=1) == []  # still hanging
    finally:
        _kill(first)
    env.master.release.set()
    second = env.spawn(1)
    try:
        counts = _reply_counts(env, {hung, read, listing, no_partition, far_offset}, timeout=60)
        assert counts == Counter({hung: 1, read: 1, listing: 1, no_partition: 1, far_offset: 1})
        assert env.answers(hung)[0].error is None
    finally:
        second.stop()


def test_every_question_is_answered_once_through_a_rebalance_and_a_kill_mid_batch(two_partitions, unique):
    """Two partitions, a mix of reads, listings and model questions (some hanging): a second worker
    joins (the first loses a partition with questions in flight), then the first is killed -9 with
    questions in flight. Every question has exactly one committed reply."""
    env = two_partitions
    first = env.spawn(0)
    reads = [_read(unique(f"q-r{i}")) for i in range(30)]
    listings = [_listing(unique(f"q-l{i}")) for i in range(6)]
    models = [_model(unique(f"q-m{i}"), hang=i % 3 == 0) for i in range(9)]
    questions = reads + listings + models
    ids = {q.question_id for q in questions}
    second = None
    try:
        env.ask(*questions[::2])
        assert env.master.hung.wait(90), "no model call started"
        second = env.spawn(1)  # joins the group: the first gives a partition away mid-batch
        env.ask(*questions[1::2])
        answered = {r.key.decode() for r in env.replies(lambda k, v: k.decode() in ids, want=20, timeout=90)}
        assert len(answered) >= 20
        _kill(first)  # with hung model calls (and whatever else) in flight
        env.master.release.set()
        counts = _reply_counts(env, ids, timeout=120)
        assert set(counts) == ids and set(counts.values()) == {1}, \
            {q: n for q, n in counts.items() if n != 1} or ids - set(counts)
    finally:
        _kill(first)
        if second is not None:
            second.stop()
