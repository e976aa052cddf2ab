"""The `context` read through Kafka, with a client the project does not ship (kafka-python) and with
the project's own client: turns produced as plain JSON, a context question, its reply from the
reply topic. The ingest and answer workers run as processes on their own topics and database, their
model endpoint a scripted server that must receive nothing."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from epistream.client.api import context
from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.replies import MemoryContext
from epistream.core.metrics import read_samples, sample_sum
from epistream.models.prompts import estimate_tokens

from .conftest import count_turns, read_topic, wait_for
from .scripted_worker import PORT_OFFSET, no_model_call, scripted_worker

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 40  # beside the test stack's ports
ASKED = "2024-05-08T12:00:00+00:00"  # a Wednesday


@pytest.fixture(scope="module")
def workers(kafka):
    with scripted_worker(kafka, no_model_call, metrics_port=METRICS_PORT, name="context",
                         workers=("ingest", "answer")) as running:
        yield running


def _turn(tenant: str, conversation: str, n: int, speaker: str, text: str, ts: str) -> dict:
    return {"tenant": tenant, "conversation_id": conversation, "turn_id": f"t{n:03d}", "speaker": speaker,
            "text": text, "ts": ts}


def _produce(bootstrap: str, topic: str, records: list[tuple[str, dict]]) -> None:
    """What an agent's code does with kafka-python: JSON values, keyed by conversation or question id."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for key, value in records:
            producer.send(topic, key=key.encode(), value=json.dumps(value).encode())
        producer.flush(timeout=30)
    finally:
        producer.close()


def _reply(bootstrap: str, topic: str, question_id: str, *, timeout_s: float = 60) -> dict:
    """The reply keyed by the question id, read as committed (the worker writes in transactions)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level="read_committed")
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    if record.key == question_id.encode():
                        return json.loads(record.value)
        raise AssertionError(f"no reply to {question_id} on {topic} within {timeout_s}s")
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def conversation(workers):
    """Tenant A's conversation and tenant B's, produced with kafka-python, stored by the ingest worker."""
    settings = workers.settings
    stamp = f"{time.time_ns()}"
    tenant, other = f"ctx-kp-a-{stamp}", f"ctx-kp-b-{stamp}"
    a = [_turn(tenant, "trip", 1, "Mia", "We booked the ferry to Tangier for next Friday.", "2024-05-06T09:00:00+02:00"),
         _turn(tenant, "trip", 2, "Leo", "I packed the blue tent and the camping stove.", "2024-05-06T09:01:00+02:00"),
         _turn(tenant, "trip", 3, "Mia", "Last month I renewed my passport in Madrid.", "2024-04-10T18:00:00+02:00")]
    b = [_turn(other, "secret", 1, "Zed", "The ferry to Tangier carries my zebra Quixote.", "2024-05-06T09:00:00+00:00")]
    _produce(settings.kafka_bootstrap, settings.topic_turns, [(t["conversation_id"], t) for t in a + b])
    wait_for(lambda: count_turns(workers.db_url, tenant, "trip") == 3 and count_turns(workers.db_url, other, "secret") == 1,
             timeout=120, what="the produced turns stored")
    return tenant, other


def _samples(name: str, **labels: str) -> float:
    return sample_sum(read_samples(f"http://127.0.0.1:{METRICS_PORT + PORT_OFFSET['answer']}/metrics"), name, **labels)


def test_kafka_python_asks_for_context_and_reads_the_reply(workers, conversation):
    settings = workers.settings
    tenant, _ = conversation
    question_id = f"kp-{time.time_ns()}"
    _produce(settings.kafka_bootstrap, settings.topic_questions, [(question_id, {
        "question_id": question_id, "tenant": tenant, "question": "When is the ferry to Tangier?",
        "mode": "context", "budget_tokens": 60, "asked_at": ASKED})])
    reply = _reply(settings.kafka_bootstrap, settings.topic_answers, question_id)
    assert reply["kind"] == "context" and reply.get("error") is None
    assert reply["items"][0]["turn_id"] == "t001" and "ferry to Tangier" in reply["text"]
    lines = reply["text"].splitlines()
    headers = [line for line in lines if line.startswith("# ")]  # one per day, counted in the budget too
    assert (sum(i["tokens"] for i in reply["items"]) + sum(map(estimate_tokens, headers)) + len(lines) - 1
            == reply["used_tokens"] <= 60)
    first = reply["items"][0]
    assert first["time"] == "2024-05-06T09:00:00+02:00" and first["dates"][0]["start"] == "2024-05-17"  # "next Friday": of the following week
    assert "Quixote" not in reply["text"] and {i["conversation_id"] for i in reply["items"]} == {"trip"}
    MemoryContext.model_validate(reply)  # the product's own contract reads what kafka-python got


def test_the_projects_client_reads_context_with_resolved_dates(workers, conversation):
    tenant, _ = conversation
    reply = asyncio.run(context(workers.settings, tenant=tenant, question="What did Mia do last month?",
                                asked_at=datetime.fromisoformat(ASKED), budget_tokens=500))
    assert reply.error is None and [(p.expression, str(p.start), str(p.end)) for p in reply.resolved if p.filters] == [
        ("last month", "2024-04-01", "2024-04-30")]
    assert [i.turn_id for i in reply.items if i.kind == "turn"][0] == "t003"  # the only turn of April comes first
    assert reply.latency_ms > 0 and reply.used_tokens <= 500


def test_no_model_call_is_made_and_context_reads_are_counted(workers, conversation):
    tenant, _ = conversation
    before = _samples("epistream_context_read_duration_seconds_count")
    asyncio.run(context(workers.settings, tenant=tenant, question="What did Leo pack?",
                        asked_at=datetime.fromisoformat(ASKED)))
    assert _samples("epistream_context_read_duration_seconds_count") == before + 1
    assert _samples("epistream_answer_questions_total", mode="context") >= 3
    assert _samples("epistream_model_requests_total") == 0
    assert workers.server.requests == []


def test_a_failed_context_read_is_a_context_with_its_error_and_a_dead_letter(workers, conversation):
    settings = workers.settings
    tenant, _ = conversation
    question_id = f"kp-bad-{time.time_ns()}"
    _produce(settings.kafka_bootstrap, settings.topic_questions, [(question_id, {
        "question_id": question_id, "tenant": tenant, "question": "Anything?", "mode": "context",
        "reply_topic": "nobody.listens.here"})])
    reply = _reply(settings.kafka_bootstrap, settings.topic_answers, question_id)
    assert reply["kind"] == "context" and reply["error"].startswith("UnknownReplyTopic") and reply["items"] == []
    letters = asyncio.run(read_topic(settings, settings.topic_dlq, lambda k, v: k == question_id.encode()))
    assert DeadLetter.model_validate_json(letters[0].value).error_class == "UnknownReplyTopic"
