"""The answer path on the real stack: memory.questions -> answer consumer -> memory.answers."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from epistream.client.api import ask
from epistream.consumers.retrieval import FUSED_TURNS, search_turns
from epistream.contracts.base import RECORD_HEADER
from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.questions import WITHDRAWAL_RECORD, Mode, Question, Withdrawal
from epistream.contracts.replies import Answer, Progress, ProgressStep
from epistream.messaging.kafka_io import create_producer
from epistream.models.embeddings import Embedder
from epistream.storage.db import create_pool, tenant_scope

from .conftest import count_turns, read_topic, wait_for
from .helpers import make_turns, produce_bytes, produce_turns

pytestmark = pytest.mark.integration

ASKED = [
    ("Nora", "My daughter Ines started violin lessons at the conservatory on Tuesday."),
    ("Sam", "That is wonderful, how is she finding the violin?"),
]
OTHER = [
    ("Nora", "My son Tiago started violin lessons at the music school on Tuesday."),
    ("Sam", "Violin lessons are a big step for him."),
]


@pytest.fixture
def two_conversations(stack, db_url, unique):
    tenant = unique("tenant")
    asked, other = unique("asked"), unique("other")
    stranger_tenant = unique("stranger")
    produce_turns(stack, make_turns(tenant, asked, ASKED) + make_turns(tenant, other, OTHER)
                  + make_turns(stranger_tenant, asked, OTHER))
    for t, c in ((tenant, asked), (tenant, other), (stranger_tenant, asked)):
        wait_for(lambda t=t, c=c: count_turns(db_url, t, c) == 2, what=f"{c} stored")
    return tenant, asked, other, stranger_tenant


def test_retrieval_is_confined_to_the_asked_conversations_and_tenant(stack, two_conversations):
    tenant, asked, other, _ = two_conversations
    embedder = Embedder.from_settings(stack)
    query = "When did the child start violin lessons?"

    async def search(conversations):
        pool = create_pool(stack)
        await pool.open(wait=True)
        try:
            async with pool.connection() as conn, tenant_scope(conn, tenant):
                return await search_turns(conn, tenant=tenant, query=query, vector=embedder.embed_query(query),
                                          conversation_ids=conversations, recipe=replace(FUSED_TURNS, top_k=10))
        finally:
            await pool.close()

    only_asked = asyncio.run(search([asked]))
    assert {t.conversation_id for t in only_asked} == {asked}
    both = asyncio.run(search(None))
    # Without a filter: both conversations of this tenant, never the stranger tenant's copy.
    assert {t.conversation_id for t in both} == {asked, other}
    assert len(both) == 4


def test_question_gets_an_answer_with_evidence_from_the_asked_conversation_only(stack, two_conversations):
    tenant, asked, _, _ = two_conversations
    question = Question(
        question_id=f"q-{uuid.uuid4()}", tenant=tenant, question="Who started violin lessons at the conservatory?",
        conversation_ids=[asked], asked_at=datetime(2024, 6, 1, tzinfo=UTC), mode=Mode.FAST,
    )
    answer = asyncio.run(ask(stack, question, timeout_s=240))
    assert answer.question_id == question.question_id and answer.tenant == tenant
    assert answer.mode is Mode.FAST and answer.latency_ms > 0
    assert answer.error is None, answer.error
    assert answer.tokens["master"].calls >= 1 and answer.tokens["master"].prompt > 0
    if not answer.abstained:
        assert answer.evidence, "a non-abstaining answer cites evidence"
    for ev in answer.evidence:
        assert ev.conversation_id == asked
        assert ev.quote in {text for _, text in ASKED}
        assert ev.time.tzinfo is not None


def test_question_about_an_empty_memory_abstains_without_a_model_call(stack, unique):
    question = Question(
        question_id=f"q-{uuid.uuid4()}", tenant=unique("nobody"), question="What did I eat yesterday?",
        mode=Mode.FAST,
    )
    answer = asyncio.run(ask(stack, question, timeout_s=120))
    assert answer.abstained and answer.evidence == []
    assert answer.tokens["master"].calls == 0


def test_malformed_question_is_dead_lettered_and_later_questions_are_answered(stack, unique):
    marker = unique("bad-question").encode()
    bad = b'{"question_id": "' + marker + b'", "question": "no tenant here"}'
    produce_bytes(stack, [(marker, bad)], topic=stack.topic_questions)
    letters = asyncio.run(read_topic(stack, stack.topic_dlq, lambda k, v: k == marker))
    letter = DeadLetter.model_validate_json(letters[0].value)
    assert letter.stage == "answer" and letter.topic == stack.topic_questions
    assert "tenant" in letter.error_message and letter.original_value() == bad

    follow_up = Question(question_id=f"q-{uuid.uuid4()}", tenant=unique("t"), question="Anything?", mode=Mode.FAST)
    assert isinstance(asyncio.run(ask(stack, follow_up, timeout_s=120)), Answer)



def test_a_withdrawal_keyed_unlike_its_question_or_no_withdrawal_at_all_is_dead_lettered(stack, unique):
    """A record marked as a withdrawal must be one, keyed by the question it names (so it follows it);
    otherwise it is dead-lettered with the reason, and questions after it are answered."""
    named, wrong_key, junk_key = (unique(p).encode() for p in ("q-named", "q-other", "q-junk"))
    withdrawal = Withdrawal(question_id=named.decode(), tenant=unique("t")).to_bytes()
    marked = [(RECORD_HEADER, WITHDRAWAL_RECORD)]

    async def send() -> None:
        producer = create_producer(stack)
        await producer.start()
        try:
            await producer.send_and_wait(stack.topic_questions, key=wrong_key, value=withdrawal, headers=marked)
            await producer.send_and_wait(stack.topic_questions, key=junk_key, value=b'{"kind": "no"}', headers=marked)
        finally:
            await producer.stop()

    asyncio.run(send())
    letters = {r.key: DeadLetter.model_validate_json(r.value) for r in asyncio.run(read_topic(
        stack, stack.topic_dlq, lambda k, v: k in (wrong_key, junk_key), want=2))}
    assert "must be keyed by that id" in letters[wrong_key].error_message
    assert "withdrawal" in letters[junk_key].error_message and letters[junk_key].stage == "answer"
    follow_up = Question(question_id=f"q-{uuid.uuid4()}", tenant=unique("t"), question="Anything?", mode=Mode.FAST)
    assert isinstance(asyncio.run(ask(stack, follow_up, timeout_s=120)), Answer)


@pytest.mark.parametrize("mode", [Mode.DEEP, Mode.AGENTIC])
def test_deep_and_agentic_questions_through_kafka_with_the_local_model(stack, two_conversations, mode):
    tenant, asked, _, _ = two_conversations
    question = Question(
        question_id=f"q-{uuid.uuid4()}", tenant=tenant, question="Who started violin lessons at the conservatory?",
        conversation_ids=[asked], asked_at=datetime(2024, 6, 1, tzinfo=UTC), mode=mode,
    )
    steps: list[Progress] = []

    async def on_progress(step: Progress) -> None:
        steps.append(step)

    answer = asyncio.run(ask(stack, question, timeout_s=300, on_progress=on_progress))
    assert answer.mode is mode and answer.error is None, answer.error
    assert answer.tokens["master"].calls >= 1 or answer.abstained
    if mode is Mode.DEEP:
        assert answer.tokens["assistant"].calls >= 1, "the open segment was read by an assistant"
    # The steps the worker took, as it took them (what an MCP client's progress notifications say).
    assert [s.seq for s in steps] == list(range(1, len(steps) + 1)) and {s.mode for s in steps} == {mode}
    kinds = [s.step for s in steps]
    assert kinds[0] is ProgressStep.MODE
    if mode is Mode.AGENTIC:  # each tool the model chose, numbered; the loop ends with output_answer or the cap
        calls = [s for s in steps if s.step is ProgressStep.TOOL_CALL]
        assert [s.done for s in calls] == list(range(1, len(calls) + 1)) and calls, kinds
        assert all(s.tool and s.total == stack.agentic_max_steps for s in calls)
    else:
        assert kinds[1] is ProgressStep.RETRIEVED, kinds
        assert (kinds[-1] is ProgressStep.MASTER_CALL) == (answer.tokens["master"].calls >= 1), (kinds, answer)
        assert kinds.count(ProgressStep.ASSISTANT_READ) == answer.tokens["assistant"].calls
    for ev in answer.evidence:
        assert ev.conversation_id == asked
