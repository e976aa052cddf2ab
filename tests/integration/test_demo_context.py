"""The demo leads with its `context` reads (issue 28): for each sample question, the turn that holds
its evidence is in the read at the demo's own budget, through the real ingest and answer workers
(no model: a context read calls none)."""

from __future__ import annotations

import asyncio
import os

import pytest

from epistream.apps.cli.demo import DEMO_BUDGET_TOKENS, asked_at_for, sample_questions, sample_turns
from epistream.client.api import context, produce_raw
from epistream.settings.processes import Settings

from .conftest import count_turns, wait_for
from .scripted_worker import no_model_call, scripted_worker

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 60  # beside the test stack's ports


def _cases() -> list:
    # "Where did Alice live in February 2024?" too: nothing was said in February, and the read ranks the
    # latest home named before its end (Porto, in January) first.
    return [pytest.param(item, id=item["question"]) for item in sample_questions() if item["evidence"]]


@pytest.fixture(scope="module")
def demo_memory(kafka: Settings):
    """The sample conversation produced as the demo produces it, stored by the ingest worker."""
    with scripted_worker(kafka, no_model_call, metrics_port=METRICS_PORT, name="demo",
                         workers=("ingest", "answer")) as running:
        turns = sample_turns()
        asyncio.run(produce_raw(running.settings, [(t.conversation_id.encode(), t.to_bytes()) for t in turns]))
        wait_for(lambda: count_turns(running.db_url, turns[0].tenant, turns[0].conversation_id) == len(turns),
                 timeout=120, what="the sample conversation stored")
        yield running.settings, turns


@pytest.mark.parametrize("item", _cases())
def test_each_demo_question_finds_its_evidence_in_the_context_read(demo_memory, item) -> None:
    settings, turns = demo_memory
    reply = asyncio.run(context(settings, tenant=turns[0].tenant, question=item["question"],
                                conversation_ids=[turns[0].conversation_id], asked_at=asked_at_for(turns),
                                budget_tokens=DEMO_BUDGET_TOKENS))
    found = {turn_id for i in reply.items for turn_id in i.turn_ids}
    assert reply.error is None and set(item["evidence"]) <= found, reply.text
