"""The keyword pathway reads the question's lexemes as plainto_tsquery stemmed them, once: a word the
'english' configuration would stem again ("sunrise" -> 'sunris' -> 'sunri') still finds its turn.
BM25 weighs a rare word above a common one."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from epistream.consumers.retrieval import FUSED_TURNS, search_turns
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.storage.db import tenant_scope

from .helpers import make_turns

pytestmark = pytest.mark.integration

SAID = [("Ana", "We watched the sunrise from the lighthouse."), ("Ben", "We raised enough for the kayak club."),
        ("Ana", "The ferry was late again.")]


# Every other word is a stop word, so only the twice-stemmed one could match.
@pytest.mark.parametrize(("question", "turn_id"), [("And what about the sunrise?", "t001"),
                                                   ("What was it they raised?", "t002")])
async def test_a_word_stemmed_once_finds_its_turn(postgres, pool, unique, question, turn_id):
    embedder = Embedder.from_settings(postgres)
    tenant, conversation = unique("tenant"), unique("conv")
    turns = make_turns(tenant, conversation, SAID)
    records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), int(time.time() * 1000)) for i, t in enumerate(turns)]
    await ingest_batch(records, pool=pool, embedder=embedder, metrics=Metrics.create())

    async def lexical() -> list[str]:
        recipe = replace(FUSED_TURNS, pathways=("lexical",))
        async with pool.connection() as conn, tenant_scope(conn, tenant):
            found = await search_turns(conn, tenant=tenant, query=question, vector=embedder.embed_query(question),
                                       conversation_ids=[conversation], recipe=recipe)
        return [t.turn_id for t in found]

    assert (await lexical())[:1] == [turn_id]  # BM25 reads the lexemes once


async def test_bm25_ranks_the_turn_with_the_rare_word_above_one_repeating_common_words(postgres, pool, unique):
    embedder = Embedder.from_settings(postgres)
    tenant, conversation = unique("tenant"), unique("conv")
    said = [("Ana", f"Today was a good day, day {n} of the week.") for n in range(8)]
    said += [("Ben", "Good good day, a good good day today."), ("Ana", "The volcano today was quiet.")]
    turns = make_turns(tenant, conversation, said)
    records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), int(time.time() * 1000)) for i, t in enumerate(turns)]
    await ingest_batch(records, pool=pool, embedder=embedder, metrics=Metrics.create())
    question = "Was it a good day at the volcano today?"

    async def best() -> str:
        recipe = replace(FUSED_TURNS, pathways=("lexical",))
        async with pool.connection() as conn, tenant_scope(conn, tenant):
            found = await search_turns(conn, tenant=tenant, query=question, vector=embedder.embed_query(question),
                                       conversation_ids=[conversation], recipe=recipe)
        return found[0].text

    assert await best() == "The volcano today was quiet."  # "volcano" is in one turn of ten


async def test_only_the_rarest_words_find_turns_under_the_match_cap_and_common_words_still_weigh(
        postgres, pool, unique):
    """A common word no longer pulls every turn saying it into the lexical pathway (its cost grew with the
    conversation); the rare word's turns are still found, and ranked by every word they share."""
    embedder = Embedder.from_settings(postgres)
    tenant, conversation = unique("tenant"), unique("conv")
    said = [("Ana", f"It was a really nice walk, number {n}.") for n in range(12)]
    said += [("Ben", "The volcano walk was really nice."), ("Ana", "The volcano map was quite old.")]
    turns = make_turns(tenant, conversation, said)
    records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), int(time.time() * 1000)) for i, t in enumerate(turns)]
    await ingest_batch(records, pool=pool, embedder=embedder, metrics=Metrics.create())
    question = "Was the volcano walk really nice?"

    async def found(match_cap: int) -> list[str]:
        recipe = replace(FUSED_TURNS, pathways=("lexical",), match_cap=match_cap)
        async with pool.connection() as conn, tenant_scope(conn, tenant):
            hits = await search_turns(conn, tenant=tenant, query=question, vector=embedder.embed_query(question),
                                      conversation_ids=[conversation], recipe=recipe)
        return [t.text for t in hits]

    uncapped, capped = await found(0), await found(5)
    assert len(uncapped) == FUSED_TURNS.top_k  # "walk", "really", "nice" find every turn
    # "volcano" (2 turns) is taken; "walk" (13) would pass the cap of 5: only the volcano turns are found,
    # and of two as long, the one sharing the common words too comes first, as without the cap.
    assert capped == ["The volcano walk was really nice.", "The volcano map was quite old."]
    assert uncapped[0] == capped[0]


async def test_a_common_word_alone_finds_no_more_turns_than_the_match_cap(postgres, pool, unique):
    embedder = Embedder.from_settings(postgres)
    tenant, conversation = unique("tenant"), unique("conv")
    turns = make_turns(tenant, conversation, [("Ana", f"A really long walk, number {n}.") for n in range(12)])
    records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), int(time.time() * 1000)) for i, t in enumerate(turns)]
    await ingest_batch(records, pool=pool, embedder=embedder, metrics=Metrics.create())
    recipe = replace(FUSED_TURNS, pathways=("lexical",), match_cap=3, top_k=20, pool=20)
    async with pool.connection() as conn, tenant_scope(conn, tenant):
        hits = await search_turns(conn, tenant=tenant, query="walk", vector=embedder.embed_query("walk"),
                                  conversation_ids=[conversation], recipe=recipe)
    assert len(hits) == 3


async def _term_counts(pool, tenant: str, conversation: str) -> dict[str, int]:
    async with pool.connection() as conn, tenant_scope(conn, tenant):
        cur = await conn.execute("SELECT lexeme, turns FROM memory.term_counts WHERE conversation_id = %s",
                                 (conversation,))
        return dict(await cur.fetchall())


async def _exact_counts(pool, tenant: str, conversation: str) -> dict[str, int]:
    """The same counts from the turns themselves ('' = the conversation's turns)."""
    async with pool.connection() as conn, tenant_scope(conn, tenant):
        cur = await conn.execute(
            "SELECT w.lexeme, count(*)::int FROM memory.turns t CROSS JOIN LATERAL"
            " (SELECT u.lexeme FROM unnest(t.tsv) u UNION ALL SELECT '') w"
            " WHERE t.conversation_id = %s GROUP BY w.lexeme", (conversation,))
        return dict(await cur.fetchall())


async def test_word_counts_follow_every_write_a_replay_a_correction_and_a_forget(postgres, pool, unique):
    """BM25's document frequencies (memory.term_counts) equal a recount of the turns after an ingest, a
    replay of the same records, a corrected turn and a forget, which leaves none of the words behind."""
    from epistream.pipeline.store.forget import forget

    embedder = Embedder.from_settings(postgres)
    tenant, conversation, other = unique("tenant"), unique("conv"), unique("other")
    said = [("Ana", "The volcano walk was really nice."), ("Ben", "A really long walk to the volcano."),
            ("Ana", "We had ramen after the walk.")]

    async def ingest(turns, first_offset: int = 0) -> None:
        records = [RawRecord("memory.turns", 0, first_offset + i, None, t.to_bytes(), int(time.time() * 1000))
                   for i, t in enumerate(turns)]
        await ingest_batch(records, pool=pool, embedder=embedder, metrics=Metrics.create())

    turns = make_turns(tenant, conversation, said)
    await ingest(turns)
    await ingest(make_turns(tenant, other, said[:1]))
    counts = await _term_counts(pool, tenant, conversation)
    assert counts[""] == 3 and counts["walk"] == 3 and counts["volcano"] == 2 and counts["ramen"] == 1
    assert counts == await _exact_counts(pool, tenant, conversation)

    await ingest(turns)  # a replay: nothing changes
    assert await _term_counts(pool, tenant, conversation) == counts
    corrected = turns[2].model_copy(update={"text": "We had dumplings after the swim."})
    await ingest([corrected], first_offset=10)
    counts = await _term_counts(pool, tenant, conversation)
    assert "ramen" not in counts and counts["dumpl"] == 1 and counts["walk"] == 2 and counts[""] == 3
    assert counts == await _exact_counts(pool, tenant, conversation)

    async with pool.connection() as conn:
        await forget(conn, tenant, conversation)
    assert await _term_counts(pool, tenant, conversation) == {}
    assert (await _term_counts(pool, tenant, other))["volcano"] == 1  # the other conversation's words stay
