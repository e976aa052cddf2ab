"""Each worker's /metrics endpoint shows its counters moving."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from prometheus_client.samples import Sample

from epistream.client.api import ask
from epistream.contracts.questions import Mode, Question
from epistream.core.metrics import read_samples, sample_sum

from .conftest import count_turns, wait_for
from .helpers import make_turns, produce_bytes, produce_turns

pytestmark = pytest.mark.integration


def scrape(port: int) -> list[Sample]:
    return read_samples(f"http://127.0.0.1:{port}/metrics")


def sample(samples: list[Sample], name: str, **labels: str) -> float:
    """The value of one series (summed over the labels not given), 0 if absent."""
    return sample_sum(samples, name, **labels)


def test_ingest_metrics_move(stack, db_url, unique):
    port = stack.ingest_metrics_port
    before = scrape(port)
    tenant, conversation = unique("tenant"), unique("conv")
    turns = make_turns(tenant, conversation, [("A", "metrics are moving"), ("B", "indeed they are")])
    produce_turns(stack, turns)
    produce_bytes(stack, [(conversation.encode(), b"not json at all")])
    wait_for(lambda: count_turns(db_url, tenant, conversation) == 2, what="turns stored")

    def moved() -> bool:
        after = scrape(port)
        return (
            sample(after, "epistream_ingest_turns_total", outcome="inserted")
            >= sample(before, "epistream_ingest_turns_total", outcome="inserted") + 2
            and sample(after, "epistream_dlq_messages_total", stage="ingest", error_class="ContractError")
            >= sample(before, "epistream_dlq_messages_total", stage="ingest", error_class="ContractError") + 1
        )

    wait_for(moved, timeout=30, what="ingest counters to move")
    after = scrape(port)
    assert sample(after, "epistream_ingest_produce_to_searchable_seconds_count") > 0
    assert sample(after, "epistream_embedding_duration_seconds_count") > 0


def test_answer_metrics_move(stack, unique):
    port = stack.answer_metrics_port
    before = scrape(port)
    question = Question(question_id=f"q-{uuid.uuid4()}", tenant=unique("empty"), question="Is anyone there?",
                        mode=Mode.FAST)
    asyncio.run(ask(stack, question, timeout_s=120))
    after = scrape(port)
    assert sample(after, "epistream_answer_questions_total", mode="fast") == sample(
        before, "epistream_answer_questions_total", mode="fast") + 1
    assert sample(after, "epistream_answer_duration_seconds_count", mode="fast") > sample(
        before, "epistream_answer_duration_seconds_count", mode="fast")
