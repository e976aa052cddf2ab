"""A tenant claim is checked against who sent it (epistream.core.claims): with a tenant-key secret set, a
backend holding tenant A's key gets A's turns stored and A's questions answered, while a turn or a
question it signs as tenant B, or one nobody signed, is dead-lettered with the reason and nothing
of it is stored or answered. Real ingest and answer workers, on their own topics and database."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from epistream.client.api import produce_raw
from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import MemoryContext
from epistream.core.claims import tenant_key
from epistream.messaging.tenant_topics import tenant_reply_topic
from epistream.testing.scripted_llm import ScriptedLLM

from .conftest import read_topic, wait_for
from .deployments import BASE_PORT, Deployment, deployments
from .helpers import make_turns

pytestmark = pytest.mark.integration

SECRET = "claims-test-secret-" + "x" * 32


def _never_called(body: dict) -> tuple[int, str]:
    return 500, "the context mode makes no model call"


@pytest.fixture(scope="module")
def guarded(kafka) -> Iterator[Deployment]:
    with ScriptedLLM(_never_called) as llm, deployments(kafka, 1, tenant_key_secret=SecretStr(SECRET),
                                                        llm_base_url=llm.base_url) as made:
        yield made[0]


def _letters(deployment: Deployment, key: bytes, want: int) -> list[DeadLetter]:
    found = asyncio.run(read_topic(deployment.settings, deployment.settings.topic_dlq, lambda k, v: k == key,
                                   want=want, timeout=60))
    return [DeadLetter.model_validate_json(r.value) for r in found]


def test_a_backend_cannot_write_turns_as_another_tenant(guarded, unique):
    a, b, conversation = unique("tenant-a"), unique("tenant-b"), unique("conv")
    key_a = tenant_key(SECRET.encode(), a)
    own = make_turns(a, conversation, [("Alice", "I moved to Lisbon.")])
    spoofed = make_turns(b, conversation, [("Mallory", "B's memory says so.")])
    unsigned = make_turns(b, conversation, [("Mallory", "So does this.")])
    worker = guarded.run("ingest", BASE_PORT + 5)
    try:
        key = conversation.encode()
        asyncio.run(produce_raw(guarded.settings, [(key, t.to_bytes()) for t in own + spoofed], tenant_key=key_a))
        # A client without any key (the operator's tools would sign with the secret: not this one).
        keyless = guarded.settings.with_overrides(tenant_key_secret=None)
        asyncio.run(produce_raw(keyless, [(key, unsigned[0].to_bytes())]))
        wait_for(lambda: guarded.turns(a, conversation) == 1, timeout=120, what="A's own turn stored")
        letters = _letters(guarded, key, want=2)
    finally:
        worker.stop()
    assert sorted(letter.error_message for letter in letters) == [
        f"tenant claim {b!r} not proven: the epistream-sig header is not {b!r}'s signature of this record",
        f"tenant claim {b!r} not proven: the record has no epistream-sig header",
    ]
    assert {letter.error_class for letter in letters} == {"ClaimRejected"}
    assert guarded.turns(b, conversation) == 0


def test_a_backend_cannot_ask_as_another_tenant_nor_read_its_replies(guarded, unique):
    a, b, c = unique("tenant-a"), unique("tenant-b"), unique("tenant-c")
    settings = guarded.settings
    key_a = tenant_key(SECRET.encode(), a)
    topic_a, topic_b = (tenant_reply_topic(settings.topic_answers, t) for t in (a, b))
    for tenant in (a, b):  # onboarded by the operator: A and B have reply topics, C has none
        onboarded = guarded.cli("tenant", "add", tenant)
        assert onboarded.returncode == 0 and "authenticates no one" in onboarded.stderr, onboarded.stderr

    def question(tenant: str, **fields) -> Question:
        return Question(question_id=f"q-{uuid.uuid4()}", tenant=tenant, question="Where did Alice move?",
                        mode=Mode.CONTEXT, asked_at=datetime(2024, 4, 1, tzinfo=UTC), **fields)

    spoofed, to_b, own = question(b), question(a, reply_topic=topic_b), question(a)
    not_onboarded = question(c)
    worker = guarded.run("answer", BASE_PORT + 6)
    try:
        asyncio.run(produce_raw(settings, [(q.question_id.encode(), q.to_bytes()) for q in (spoofed, to_b, own)],
                                topic=settings.topic_questions, tenant_key=key_a))
        asyncio.run(produce_raw(settings, [(not_onboarded.question_id.encode(), not_onboarded.to_bytes())],
                                topic=settings.topic_questions, tenant_key=tenant_key(SECRET.encode(), c)))
        answered = asyncio.run(read_topic(settings, topic_a, lambda k, v: k == own.question_id.encode(), timeout=90))
        letters = {q.question_id: _letters(guarded, q.question_id.encode(), want=1)
                   for q in (spoofed, to_b, not_onboarded)}
        # The others were before A's own question on the one partition: by now each has had its turn.
        elsewhere = [asyncio.run(read_topic(settings, topic, lambda k, v: True, timeout=2))
                     for topic in (topic_b, settings.topic_answers)]
    finally:
        worker.stop()
    assert len(answered) == 1 and MemoryContext.from_bytes(answered[0].value).tenant == a
    assert [(x.error_class, x.error_message) for x in letters[spoofed.question_id]] == [
        ("ClaimRejected", f"tenant claim {b!r} not proven: the epistream-sig header is not {b!r}'s signature "
                          "of this record")]
    assert [x.error_class for x in letters[to_b.question_id]] == ["ForeignReplyTopic"]
    assert [x.error_class for x in letters[not_onboarded.question_id]] == ["UnknownReplyTopic"]
    assert elsewhere == [[], []], "nothing reaches B's replies or the shared answers topic"
