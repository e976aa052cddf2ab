from __future__ import annotations

from datetime import UTC, datetime

from epistream.consumers.modes.fast import build_messages, evidence_from
from epistream.consumers.packing import pack, rank, render, turn_candidate
from epistream.consumers.prompts import MasterAnswer, load_prompt
from epistream.consumers.retrieval import RetrievedTurn
from epistream.contracts.questions import Question
from epistream.contracts.replies import MemoryContext
from epistream.models.llm import response_format
from epistream.settings.models import JsonMode


def _turn(i: int, text: str) -> RetrievedTurn:
    return RetrievedTurn(conversation_id="c", turn_id=f"t{i}", speaker="Ana", text=text,
                         ts=datetime(2024, 3, i, 10, 0, tzinfo=UTC), session_id=None,
                         score=1.0 / i, dense_rank=i, lexical_rank=None)


ITEMS = pack(rank(turn_candidate(t) for t in (_turn(1, "I moved to Lisbon."), _turn(2, "I adopted a cat."),
                                              _turn(3, "I ran a 10k."))), 1000).items


def _context() -> MemoryContext:
    return MemoryContext(question_id="q", tenant="t", asked_at=datetime(2024, 4, 1, tzinfo=UTC), items=ITEMS,
                         text=render(ITEMS), budget_tokens=1000, used_tokens=30, latency_ms=1.0)


def test_lines_are_numbered_best_first_and_shown_under_their_day():
    assert ITEMS[0].line == "[1] 10:00 Ana: I moved to Lisbon."
    assert [i.rank for i in ITEMS] == [1, 2, 3]
    assert render(ITEMS).splitlines()[:2] == ["# 2024-03-01 Friday", "[1] 10:00 Ana: I moved to Lisbon."]


def test_evidence_uses_only_cited_numbers_that_exist():
    ev = evidence_from(ITEMS, [2, 2, 9, 0])
    assert [e.turn_ids for e in ev] == [["t2"]]
    assert ev[0].quote == "I adopted a cat." and ev[0].time.tzinfo is not None


def test_evidence_falls_back_to_the_best_ranked_items():
    assert [e.turn_ids[0] for e in evidence_from(ITEMS, [], fallback=2)] == ["t1", "t2"]


def test_prompt_fences_memory_and_states_the_day():
    q = Question(question_id="q", tenant="t", question="Where do I live?",
                 asked_at=datetime(2024, 4, 1, tzinfo=UTC))
    system, user = build_messages(q, _context())
    assert system["content"] == load_prompt("answer_v1")
    assert user["content"].startswith("<memory>\n# 2024-03-01 Friday\n[1]") and "</memory>" in user["content"]
    assert "Today is 2024-04-01. Question: Where do I live?" in user["content"]


def test_response_format_dialects():
    llama = response_format(MasterAnswer, JsonMode.LLAMA_CPP)
    assert llama["type"] == "json_object" and llama["schema"]["required"] == ["answer", "abstain"]
    openai_style = response_format(MasterAnswer, JsonMode.JSON_SCHEMA)
    assert openai_style["json_schema"]["name"] == "MasterAnswer"
