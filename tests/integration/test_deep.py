"""The router on PostgreSQL's indexes, and `deep` answering with assistants and
a master behind scripted OpenAI-compatible servers (exact behaviour)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from epistream.consumers.answer import answer_question
from epistream.consumers.assistants import AssistantPool
from epistream.consumers.deps import AnswerDeps
from epistream.consumers.retrieval import SegmentRecipe, from_settings
from epistream.consumers.router import route
from epistream.consumers.timefilter import DateRange
from epistream.contracts.questions import Mode, Question
from epistream.contracts.turns import Turn
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.models.llm import ModelClient, create_client
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.storage.db import create_pool, tenant_scope
from epistream.testing.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.integration

T0 = datetime(2024, 5, 6, 9, 0, tzinfo=UTC)
SESSIONS = [
    [("Maya", "I finally booked the ferry to Stromboli for the volcano hike."),
     ("Leo", "Bring a headlamp for the night climb.")],
    [("Leo", "My grandmother turned ninety last weekend, we had a huge family lunch."),
     ("Maya", "Ninety! Give her my love.")],
    [("Maya", "I started a new job at the bakery on Monday, early shifts."),
     ("Leo", "Free croissants then?")],
]


def _turns(tenant: str, conversation: str) -> list[Turn]:
    turns = []
    for s, session in enumerate(SESSIONS):
        for i, (speaker, text) in enumerate(session):
            turns.append(Turn(tenant=tenant, conversation_id=conversation, turn_id=f"s{s}-t{i}", speaker=speaker,
                              text=text, ts=T0 + timedelta(days=30 * s, minutes=i), session_id=f"s{s}"))
    return turns


@pytest.fixture(scope="module")
def memory(postgres):
    """Three sessions: two closed segments and the last one still open."""
    run = uuid.uuid4().hex[:8]
    tenant, conversation = f"tenant-{run}", f"conv-{run}"
    embedder = Embedder.from_settings(postgres)
    turns = _turns(tenant, conversation)

    async def go():
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), int(time.time() * 1000))
                       for i, t in enumerate(turns)]
            await ingest_batch(records, pool=pool, embedder=embedder, metrics=Metrics.create(),
                               segmenter=SegmenterConfig(max_tokens=10_000))
        finally:
            await pool.close()

    asyncio.run(go())
    return tenant, conversation, embedder


def _route(postgres, memory, question: str, recipe: SegmentRecipe, window=None):
    tenant, conversation, embedder = memory

    async def go():
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            async with pool.connection() as conn, tenant_scope(conn, tenant):
                return await route(conn, tenant=tenant, question=question, vector=embedder.embed_query(question),
                                   conversation_ids=[conversation], recipe=recipe, window=window)
        finally:
            await pool.close()

    return asyncio.run(go())


def test_lexical_pathway_force_includes_a_strong_keyword_hit(postgres, memory):
    _, conversation, _ = memory
    routed = _route(postgres, memory, "Maya booked the ferry to Stromboli", SegmentRecipe(top_k=1).only("lexical"))
    assert routed[0].segment_id == f"{conversation}#0000" and routed[0].forced
    assert routed[0].turn_ids == ("s0-t0", "s0-t1")
    assert set(routed[0].pathway_scores) == {"lexical"}


def test_dense_pathway_finds_a_paraphrase_without_shared_words(postgres, memory):
    _, conversation, _ = memory
    routed = _route(postgres, memory, "an elderly relative celebrated a birthday", SegmentRecipe(top_k=1).only("dense"))
    assert routed[0].segment_id == f"{conversation}#0001" and not routed[0].forced


def test_turns_not_yet_in_a_closed_segment_are_routed_as_the_open_segment(postgres, memory):
    _, conversation, _ = memory
    routed = _route(postgres, memory, "Where does Maya work now, the bakery?", SegmentRecipe(top_k=1))
    assert routed[0].segment_id == f"{conversation}#open" and routed[0].is_open
    assert routed[0].turn_ids == ("s2-t0", "s2-t1")


def test_time_window_keeps_only_segments_said_in_it(postgres, memory):
    _, conversation, _ = memory
    june = DateRange(datetime(2024, 6, 1, tzinfo=UTC), datetime(2024, 7, 1, tzinfo=UTC))
    routed = _route(postgres, memory, "what happened?", SegmentRecipe(top_k=5), window=june)
    assert [r.segment_id for r in routed] == [f"{conversation}#0001"]


def _assistant(body: dict) -> tuple[int, str]:
    prompt = body["messages"][-1]["content"]
    if "Stromboli" not in prompt:
        return 200, json.dumps({"relevant": False, "evidence": []})
    turn_id = re.search(r"\((s\d-t\d)\) Maya: I finally booked", prompt).group(1)
    return 200, json.dumps({"relevant": True, "evidence": [
        {"turn_id": turn_id, "quote": "I finally booked the ferry to Stromboli"},
        {"turn_id": turn_id, "quote": "a quote that was never said"},
    ]})


def _master(body: dict) -> tuple[int, str]:
    evidence = body["messages"][-1]["content"]
    assert "<evidence>\n[1] 2024-05-06 09:00 (Monday) Maya: I finally booked the ferry to Stromboli" in evidence
    return 200, json.dumps({"answer": "The ferry to Stromboli", "abstain": False, "evidence": [1]})


def _deps(postgres, assistant_urls: list[str], master_url: str, reads: str = "windows", **windows
          ) -> tuple[AnswerDeps, Metrics]:
    metrics = Metrics.create()
    recipes = from_settings(postgres)
    recipes = replace(recipes, windows=replace(recipes.windows, reads=reads, **windows))

    def client(url: str, role: str) -> ModelClient:
        return ModelClient(create_client(postgres, base_url=url), role=role, model="m", json_mode=postgres.llm_json_mode,
                           metrics=metrics, max_retries=0, backoff_s=0.01)

    pool = create_pool(postgres)
    assistants = AssistantPool([client(u, "assistant") for u in assistant_urls], concurrency=2, max_tokens=100)
    return AnswerDeps(postgres, pool, Embedder.from_settings(postgres), client(master_url, "master"), metrics,
                      assistants, recipes, read_pool=pool), metrics


def _ask(deps: AnswerDeps, question: Question):
    async def go():
        await deps.pool.open(wait=True)
        try:
            return await answer_question(question, deps)
        finally:
            await deps.pool.close()
    return asyncio.run(go())


@pytest.mark.parametrize(("reads", "expected_reads"), [("segments", 3), ("windows", 1)])
def test_deep_mode_reads_in_parallel_and_answers_from_verified_quotes(postgres, memory, reads, expected_reads):
    tenant, conversation, _ = memory
    with ScriptedLLM(_assistant) as a1, ScriptedLLM(_assistant) as a2, ScriptedLLM(_master) as master:
        deps, metrics = _deps(postgres, [a1.base_url, a2.base_url], master.base_url, reads=reads)
        question = Question(question_id="q1", tenant=tenant, question="What did Maya book for the volcano hike?",
                            conversation_ids=[conversation], asked_at=datetime(2024, 8, 1, tzinfo=UTC),
                            mode=Mode.DEEP)
        answer = _ask(deps, question)
        read_prompts = [r["messages"][-1]["content"] for r in a1.requests + a2.requests]
    assert answer.mode is Mode.DEEP and not answer.abstained and answer.answer == "The ferry to Stromboli"
    assert [(e.segment_id, e.turn_ids, e.quote) for e in answer.evidence] == [
        (f"{conversation}#0000", ["s0-t0"], "I finally booked the ferry to Stromboli")]
    assert answer.evidence[0].time == T0
    # segments: one read per activated segment (two closed, one open); windows: the six turns are within
    # three of each other, so one window holds them all, each read once.
    assert len(read_prompts) == expected_reads
    assert answer.tokens["assistant"].calls == expected_reads and answer.tokens["master"].calls == 1
    assert sum(p.count(") Leo: ") + p.count(") Maya: ") for p in read_prompts) == 6  # every turn read once


def test_a_reading_window_keeps_to_the_turns_around_the_best_ones(postgres, memory):
    tenant, conversation, _ = memory
    with ScriptedLLM(_assistant) as assistant, ScriptedLLM(_master) as master:
        deps, _ = _deps(postgres, [assistant.base_url], master.base_url, reads="windows", each_side=0, windows=1)
        answer = _ask(deps, Question(question_id="q4", tenant=tenant, question="What did Maya book for the volcano hike?",
                                     conversation_ids=[conversation], mode=Mode.DEEP))
        (read,) = [r["messages"][-1]["content"] for r in assistant.requests]
    assert "Stromboli" in read and "grandmother" not in read and "bakery" not in read  # the best turn alone
    assert answer.evidence[0].turn_ids == ["s0-t0"]


def test_deep_mode_abstains_without_a_master_call_when_no_assistant_finds_evidence(postgres, memory):
    tenant, conversation, _ = memory
    with ScriptedLLM(lambda body: (200, json.dumps({"relevant": False, "evidence": []}))) as assistant, \
            ScriptedLLM(_master) as master:
        deps, _ = _deps(postgres, [assistant.base_url], master.base_url)
        answer = _ask(deps, Question(question_id="q2", tenant=tenant, question="What is the name of Leo's dog?",
                                     conversation_ids=[conversation], mode=Mode.DEEP))
        assert master.requests == []
    assert answer.abstained and answer.evidence == [] and answer.tokens["master"].calls == 0


def test_a_failing_assistant_does_not_sink_the_question(postgres, memory):
    tenant, conversation, _ = memory
    with ScriptedLLM(lambda body: (500, "down")) as broken, ScriptedLLM(_assistant) as healthy, \
            ScriptedLLM(_master) as master:
        deps, metrics = _deps(postgres, [broken.base_url, healthy.base_url], master.base_url)
        answer = _ask(deps, Question(question_id="q3", tenant=tenant, question="What did Maya book, the ferry?",
                                     conversation_ids=[conversation], mode=Mode.DEEP))
    # Whichever replica the Stromboli segment hashes to, the answer is either found or an honest abstention.
    assert answer.mode is Mode.DEEP
    assert answer.abstained or answer.evidence[0].turn_ids == ["s0-t0"]
