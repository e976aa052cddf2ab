"""`agentic` mode: the master's tool loop over the real memory, with a scripted
master (exact tool calls) and the real assistants/tools underneath."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime

import pytest

from epistream.contracts.questions import Mode, Question
from epistream.testing.scripted_llm import ScriptedLLM

from .seed import seed_memory
from .test_deep import _ask, _deps

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def seeded(postgres):
    run = uuid.uuid4().hex[:8]
    tenant, conversation = f"tenant-{run}", f"conv-{run}"
    seed_memory(postgres, tenant, conversation)
    return tenant, conversation


def _counting_master(body: dict) -> tuple[int, str]:
    """Ask for a count of Alice's adoptions, then answer citing the fact it returned."""
    last = body["messages"][-1]["content"]
    if not last.startswith("Result of"):
        return 200, json.dumps({"tool": "find_entity_contexts",
                                "arguments": {"subject": "Alice", "predicate": "adopted", "aggregate": "count"}})
    result = json.loads(last.split(": ", 1)[1])
    fact_ids = re.findall(r'"fact_id": "([^"]+)"', json.dumps(result))
    return 200, json.dumps({"tool": "output_answer", "arguments": {
        "answer": str(result["count"]), "abstain": False, "evidence": fact_ids}})


def test_the_tool_loop_counts_with_structured_facts_and_cites_them(postgres, seeded):
    tenant, conversation = seeded
    with ScriptedLLM(_counting_master) as master, ScriptedLLM(lambda b: (500, "unused")) as assistant:
        deps, _ = _deps(postgres, [assistant.base_url], master.base_url)
        answer = _ask(deps, Question(question_id="q", tenant=tenant, question="How many pets did Alice adopt?",
                                     conversation_ids=[conversation], asked_at=datetime(2024, 4, 1, tzinfo=UTC),
                                     mode=Mode.AUTO))
        steps = len(master.requests)
    assert answer.mode is Mode.AGENTIC, "auto sends counting questions to the tools"
    assert answer.answer == "1" and not answer.abstained and steps == 2
    assert [e.quote for e in answer.evidence] == ["Alice adopted Miso"]
    assert answer.evidence[0].conversation_id == conversation and answer.evidence[0].turn_ids == ["t005"]
    assert answer.tokens["master"].calls == 2


def test_a_bad_tool_call_comes_back_as_an_error_and_the_loop_is_bounded(postgres, seeded):
    tenant, conversation = seeded

    def stubborn(body: dict) -> tuple[int, str]:
        return 200, json.dumps({"tool": "find_entity_contexts", "arguments": {"limit": 5000}})

    with ScriptedLLM(stubborn) as master, ScriptedLLM(lambda b: (500, "unused")) as assistant:
        deps, _ = _deps(postgres, [assistant.base_url], master.base_url)
        answer = _ask(deps, Question(question_id="q", tenant=tenant, question="When did Bob adopt Rex?",
                                     conversation_ids=[conversation], mode=Mode.AGENTIC))
        observations = [m["content"] for m in master.requests[-1]["messages"] if m["content"].startswith("Result")]
    assert answer.abstained and answer.evidence == []
    assert len(master.requests) == postgres.agentic_max_steps + 1
    assert all("invalid arguments" in o and "limit" in o for o in observations)


def test_read_segment_is_an_assistant_read(postgres, seeded):
    tenant, conversation = seeded

    def reader(body: dict) -> tuple[int, str]:
        last = body["messages"][-1]["content"]
        if not last.startswith("Result of"):
            return 200, json.dumps({"tool": "read_segment", "arguments": {"segment_id": f"{conversation}#0000"}})
        quotes = json.loads(last.split(": ", 1)[1])["quotes"]
        return 200, json.dumps({"tool": "output_answer", "arguments": {
            "answer": "Lisbon", "evidence": [q["turn_id"] for q in quotes]}})

    def assistant(body: dict) -> tuple[int, str]:
        return 200, json.dumps({"relevant": True, "evidence": [
            {"turn_id": "t001", "quote": "I moved to Lisbon last Wednesday"}]})

    with ScriptedLLM(reader) as master, ScriptedLLM(assistant) as helper:
        deps, _ = _deps(postgres, [helper.base_url], master.base_url)
        answer = _ask(deps, Question(question_id="q", tenant=tenant, question="Where did Alice move?",
                                     conversation_ids=[conversation], mode=Mode.AGENTIC))
    assert answer.answer == "Lisbon" and answer.tokens["assistant"].calls == 1
    assert [(e.turn_ids, e.quote) for e in answer.evidence] == [(["t001"], "I moved to Lisbon last Wednesday")]
