"""The context read on the real PostgreSQL (in process, as the eval harness calls it): the budget
holds, another tenant's memory never appears, "last week" is resolved against when it was asked
and memory of it comes first (the asker's own time_range alone filters), facts are current unless
the question asks about the past."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from psycopg_pool import AsyncConnectionPool

from epistream.consumers.context import build_context
from epistream.consumers.modes.fast import answer_fast
from epistream.consumers.packing import render
from epistream.consumers.retrieval import CONTEXT_READ, ContextRecipe, LinearRanker, Neighbours, Recipes, Sources
from epistream.consumers.retrieval.speakers import named_speakers
from epistream.contracts.questions import Mode, Question, TimeRange
from epistream.contracts.replies import MemoryContext
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.models.llm import ModelClient, create_client
from epistream.models.prompts import estimate_tokens
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.settings.ranker_cards import BUILTIN
from epistream.storage.db import create_pool, tenant_scope
from epistream.testing.scripted_llm import ScriptedLLM

from .helpers import make_turns, store_turns
from .seed import seed_memory

pytestmark = pytest.mark.integration

ASKED = datetime(2024, 3, 27, 12, 0, tzinfo=UTC)  # a Wednesday; the seeded turns are of Monday 2024-03-18


@dataclass(frozen=True)
class Deps:
    read_pool: AsyncConnectionPool
    embedder: Embedder
    recipes: Recipes


@pytest.fixture(scope="module")
def memory(postgres):
    """Tenant A's seeded memory (turns, a segment, gists, facts) and tenant B's own turns."""
    tenant, other = f"ctx-a-{datetime.now().timestamp():.0f}", f"ctx-b-{datetime.now().timestamp():.0f}"
    seed_memory(postgres, tenant, "conv-a")
    seed_memory(postgres, other, "conv-b")
    secret = make_turns(other, "conv-b-secret", [("Zed", "My zebra Quixote plays the xylophone in Lisbon.")])
    embedder = Embedder.from_settings(postgres)
    store_turns(postgres, embedder, secret)
    return tenant, other, embedder


def _ask(tenant: str, question: str, **kwargs) -> Question:
    """A `context` question asked at ASKED (``kwargs``: its budget, time range, conversations)."""
    return Question(question_id="in-process", tenant=tenant, question=question, asked_at=ASKED, mode=Mode.CONTEXT,
                    **kwargs)


def _read(postgres, embedder, *, recipes: Recipes | None = None, read: ContextRecipe = CONTEXT_READ,
          **kwargs) -> MemoryContext:
    async def go() -> MemoryContext:
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            return await build_context(_ask(**kwargs), Deps(pool, embedder, recipes or Recipes()), read)
        finally:
            await pool.close()
    return asyncio.run(go())


@pytest.mark.parametrize("budget", [50, 120, 1000])
def test_the_items_and_the_text_fit_the_budget(postgres, memory, budget):
    tenant, _, embedder = memory
    context = _read(postgres, embedder, tenant=tenant, question="Where did Alice move, and what pets were adopted?",
                    budget_tokens=budget)
    assert context.items and context.error is None
    lines = context.text.splitlines()
    headers = [line for line in lines if line.startswith("# ")]
    assert (sum(i.tokens for i in context.items) + sum(map(estimate_tokens, headers)) + len(lines) - 1
            == context.used_tokens <= budget)
    assert estimate_tokens(context.text) <= budget
    assert context.text == render(context.items) and len(lines) == len(context.items) + len(headers)
    assert all(i.tokens == estimate_tokens(i.line) for i in context.items)
    turns = [(i.conversation_id, i.turn_id) for i in context.items if i.kind == "turn"]
    assert len(turns) == len(set(turns))  # never the same turn twice
    if budget == 1000:  # room for everything: turns, gists and facts, with ids, times and scores
        assert {i.kind for i in context.items} == {"turn", "gist", "fact"}
        turn = next(i for i in context.items if i.kind == "turn")
        assert turn.time.utcoffset() == timedelta(hours=1) and "rrf" in turn.scores and turn.turn_ids == [turn.turn_id]
        assert turn.segment_id == "conv-a#0000"
        gist = next(i for i in context.items if i.kind == "gist")
        assert gist.gist_id and gist.segment_id and gist.event_date and gist.date_precision and gist.turn_ids


def test_another_tenants_memory_never_appears(postgres, memory):
    tenant, other, embedder = memory
    context = _read(postgres, embedder, tenant=tenant, question="Who plays the xylophone with a zebra named Quixote?",
                    budget_tokens=4000)
    assert context.items  # tenant A's own memory still answers (by meaning)
    assert {i.conversation_id for i in context.items} == {"conv-a"}
    assert "Quixote" not in context.text and "xylophone" not in context.text
    theirs = _read(postgres, embedder, tenant=other, question="Who plays the xylophone with a zebra named Quixote?",
                   budget_tokens=4000)
    assert "Quixote" in theirs.text and "conv-a" not in {i.conversation_id for i in theirs.items}


def _about_first(context: MemoryContext) -> tuple[list, list]:
    """The items about the question's period and the others, after checking the first come first."""
    about = [i for i in context.items if "period" in i.scores]
    rest = [i for i in context.items if "period" not in i.scores]
    assert about and max(i.rank for i in about) < min((i.rank for i in rest), default=len(context.items) + 1)
    return about, rest


def test_last_week_is_resolved_against_when_it_was_asked_and_its_memory_comes_first(postgres, memory):
    tenant, _, embedder = memory
    context = _read(postgres, embedder, tenant=tenant, question="What did Alice do last week?", budget_tokens=2000)
    (period,) = [p for p in context.resolved if p.filters]
    assert (period.expression, str(period.start), str(period.end)) == ("last week", "2024-03-18", "2024-03-24")
    about, rest = _about_first(context)
    assert rest  # first, no longer only: the rest of the memory stays, ranked after
    assert not [i for i in about if i.kind == "gist"]  # no gist is of that week
    start, end = datetime(2024, 3, 18, tzinfo=UTC), datetime(2024, 3, 25, tzinfo=UTC)
    assert all(start <= i.time < end for i in about if i.kind == "turn")
    assert [f.text for f in about if f.kind == "fact"] == ["Alice lives in Lisbon"]  # from 2024-03-13, open

    earlier = _read(postgres, embedder, tenant=tenant, question="What did Alice do last month?", budget_tokens=2000)
    about, _ = _about_first(earlier)
    assert {i.text for i in about} >= {"2024-02-26: Alice adopted a cat named Miso.", "Alice adopted Miso"}
    # Every turn was said in March; the one about February says so ("three weeks ago", said on 2024-03-18),
    # and the turn beside it comes with it.
    turns = {i.turn_id: i for i in about if i.kind == "turn"}
    assert set(turns) == {"t004", "t005"} and "neighbour_of" in turns["t004"].scores
    assert earlier.past  # a period that has ended: how things were, superseded facts included


def test_an_asked_time_range_is_kept_to(postgres, memory):
    tenant, _, embedder = memory
    outside = TimeRange(start=datetime(2024, 3, 19, tzinfo=UTC))
    context = _read(postgres, embedder, tenant=tenant, question="Where did Alice move?", budget_tokens=1000,
                    time_range=outside)
    assert not [i for i in context.items if i.kind in ("turn", "gist")] and context.time_range == outside


def test_current_facts_unless_the_question_asks_about_the_past(postgres, memory):
    tenant, _, embedder = memory
    now = _read(postgres, embedder, tenant=tenant, question="Where does Alice live?", budget_tokens=2000)
    facts = {i.text: i.current for i in now.items if i.kind == "fact"}
    assert not now.past and facts.get("Alice lives in Lisbon") is True and "Alice lives in Porto" not in facts
    then = _read(postgres, embedder, tenant=tenant, question="Where did Alice live before Lisbon?", budget_tokens=2000)
    facts = {i.text: i for i in then.items if i.kind == "fact"}
    assert then.past and facts["Alice lives in Porto"].current is False and facts["Alice lives in Lisbon"].current
    assert "superseded" in facts["Alice lives in Porto"].line and str(facts["Alice lives in Porto"].end_time) == "2024-03-01"


def test_fast_mode_puts_the_same_budgeted_context_before_its_master(postgres, memory):
    tenant, _, embedder = memory
    question = Question(question_id="q-fast", tenant=tenant, question="Where did Alice move?", asked_at=ASKED,
                        mode=Mode.FAST, budget_tokens=300)

    def master(body: dict) -> tuple[int, str]:
        return 200, json.dumps({"answer": "Lisbon", "abstain": False, "evidence": [1]})

    async def go():
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            with ScriptedLLM(master) as server:
                client = ModelClient(create_client(postgres, base_url=server.base_url, timeout_s=30), role="master",
                                     model="scripted", json_mode=postgres.llm_json_mode, metrics=Metrics.create(),
                                     max_retries=0, backoff_s=0.01)
                deps = SimpleNamespace(settings=postgres, read_pool=pool, embedder=embedder, recipes=Recipes(),
                                       master=client)
                result = await answer_fast(question, deps)
                expected = await build_context(question, deps, CONTEXT_READ)  # its own budget: 300
                return result, expected, server.requests
        finally:
            await pool.close()

    result, expected, requests = asyncio.run(go())
    (request,) = requests
    prompt = request["messages"][1]["content"]
    assert f"<memory>\n{expected.text}\n</memory>" in prompt and expected.used_tokens <= 300
    first = expected.items[0]
    assert result.answer == "Lisbon" and result.evidence[0].turn_ids == first.turn_ids
    assert result.evidence[0].quote == first.text


def test_the_turn_after_a_strong_hit_comes_with_it(postgres):
    """The answer to a question is often the next turn, sharing none of its words: it is read beside its
    hit, ahead of weaker hits, and without the neighbours it is not."""

    tenant, conversation = f"ctx-n-{datetime.now().timestamp():.0f}", "conv-n"
    said = [("Ana", "Where did you go on your trip last spring, Ben?"), ("Ben", "Clara's flat, mostly, with the dog."),
            # Weaker hits: about Ben's holidays, not about where his trip went.
             *[("Ana", f"Ben, where would you go on holiday number {i}?") for i in range(30)]]
    turns = make_turns(tenant, conversation, said)
    embedder = Embedder.from_settings(postgres)

    async def go() -> tuple[MemoryContext, MemoryContext]:
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            await ingest_batch([RawRecord("memory.turns", 0, i, None, t.to_bytes(), None) for i, t in enumerate(turns)],
                               pool=pool, embedder=embedder, metrics=Metrics.create())
            ask = _ask(tenant, "Where did Ben go on his trip?", budget_tokens=150, conversation_ids=[conversation])
            deps = Deps(pool, embedder, Recipes())
            return (await build_context(ask, deps, CONTEXT_READ),
                    await build_context(ask, deps, replace(CONTEXT_READ, neighbours=Neighbours(seeds=0))))
        finally:
            await pool.close()

    with_neighbours, without = asyncio.run(go())
    assert "t002" in [i.turn_id for i in with_neighbours.items]
    assert "t002" not in [i.turn_id for i in without.items]


def test_the_turns_of_a_speaker_the_question_names_come_first(postgres, memory):
    tenant, other, embedder = memory
    # Dana's turn holds more of the question's words and meaning: by them alone it comes first.
    dana_and_eli = make_turns(tenant, "conv-bikes", [("Dana", "I bought a red bicycle and a red helmet."),
                                                       ("Eli", "Me too, a bicycle, on the same day.")],
                              start=datetime(2024, 3, 18, 9, 0, tzinfo=UTC))
    store_turns(postgres, embedder, dana_and_eli)
    ask = {"tenant": tenant, "question": "Which red bicycle did Eli buy?", "budget_tokens": 1000,
           "conversation_ids": ["conv-bikes"]}
    named = _read(postgres, embedder, **ask)
    plain = _read(postgres, embedder, **ask, recipes=Recipes(turns=replace(Recipes().turns, speaker_bonus=0.0)))
    assert [i.speaker for i in plain.items] == ["Dana", "Eli"]  # the case the bonus is for
    assert [i.speaker for i in named.items] == ["Eli", "Dana"]
    assert named.items[0].scores["rrf"] > plain.items[1].scores["rrf"]

    async def lookup(who: str, question: str) -> list[str]:
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            async with pool.connection() as conn, tenant_scope(conn, who):
                return await named_speakers(conn, tenant=who, question=question, conversation_ids=None)
        finally:
            await pool.close()
    assert sorted(asyncio.run(lookup(tenant, "Did ELI's bike beat Dana's?"))) == ["dana", "eli"]
    assert asyncio.run(lookup(other, "What did Eli buy?")) == []  # another tenant's speakers are not looked up


def test_the_turns_a_gist_was_written_from_come_with_it(postgres, memory):
    tenant, other, embedder = memory
    # Lexical turn search only, and no turn holds "puppy": only the gist can lead to Bob's turn.
    lexical = Recipes(turns=replace(Recipes().turns, pathways=("lexical",)))
    no_neighbours = replace(CONTEXT_READ, neighbours=Neighbours(seeds=0))
    context = _read(postgres, embedder, tenant=tenant, question="Which puppy?", budget_tokens=1000, recipes=lexical,
                    read=no_neighbours)
    gists = [i for i in context.items if i.kind == "gist" and "puppy" in i.text]
    sourced = [i for i in context.items if i.kind == "turn" and "source_of_gist" in i.scores]
    assert gists and [i.turn_id for i in sourced if "Rex" in i.text] == ["t004"]
    assert all(i.conversation_id == "conv-a" for i in context.items)  # the other tenant's same ids never come
    without = _read(postgres, embedder, tenant=tenant, question="Which puppy?", budget_tokens=1000, recipes=lexical,
                    read=replace(no_neighbours, sources=Sources(gists=0)))
    assert not [i for i in without.items if i.kind == "turn"]


def test_the_shipped_ranker_reorders_the_same_memory_within_the_budget_and_keeps_the_period_first(postgres, memory):
    """The read as the worker runs it by default (EPISTREAM_CONTEXT_RANKER=builtin): the same candidates as
    without the ranker, reordered, within the budget, memory about the question's period still first."""
    tenant, _, embedder = memory
    ranked_read = replace(CONTEXT_READ, ranker=LinearRanker.load(BUILTIN.path))
    ask = {"tenant": tenant, "question": "What did Alice do last week?", "budget_tokens": 4000}
    ranked, plain = _read(postgres, embedder, read=ranked_read, **ask), _read(postgres, embedder, **ask)
    assert ranked.used_tokens <= 4000
    assert {i.line.split("] ", 1)[1] for i in ranked.items} == {i.line.split("] ", 1)[1] for i in plain.items}
    _about_first(ranked)
    # The budget too small for all of it: the ranker's choice of what fits.
    small = _read(postgres, embedder, read=ranked_read, tenant=tenant, question="Where does Alice live?",
                  budget_tokens=60)
    assert small.items and small.used_tokens <= 60
