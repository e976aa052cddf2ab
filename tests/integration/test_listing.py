"""A conversation's listing on the real PostgreSQL (the MCP server's resources read it through the answer
worker): the timeline is every gist of that conversation in the order things happened; the facts are
its current ones only; neither shows another conversation's or another tenant's memory; the budget holds.
The conversations listing pages through the tenant's conversation ids by prefix, and never names another
tenant's."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from psycopg_pool import AsyncConnectionPool

from epistream.consumers.listing import ListingRefused, check_listing, read_listing
from epistream.consumers.retrieval import Recipes
from epistream.contracts.questions import ConversationPage, Mode, Question
from epistream.contracts.replies import MemoryContext
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.storage.db import create_pool

from .helpers import make_turns, store_turns
from .seed import KNOWN_OUTPUT, seed_memory

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Deps:
    read_pool: AsyncConnectionPool
    embedder: Embedder
    recipes: Recipes
    metrics: Metrics


@pytest.fixture(scope="module")
def seeded(postgres):
    run = uuid.uuid4().hex[:8]
    tenant, other_tenant = f"list-a-{run}", f"list-b-{run}"
    seed_memory(postgres, tenant, "conv-a")
    # Another tenant's conversation of the same id and words. (Not a second conversation of the same tenant:
    # its identical facts would supersede these, current being tenant-wide, memory.current_facts.)
    seed_memory(postgres, other_tenant, "conv-a")
    return tenant


def _listing(postgres, tenant: str, listing: str, *, conversation: str = "conv-a", budget: int = 4000) -> MemoryContext:
    return _read(postgres, Question(question_id=f"l-{uuid.uuid4()}", tenant=tenant, question=listing,
                                    mode=Mode.CONTEXT, conversation_ids=[conversation],
                                    asked_at=datetime(2024, 3, 27, tzinfo=UTC), budget_tokens=budget, listing=listing))


def _read(postgres, question: Question) -> MemoryContext:
    async def go() -> MemoryContext:
        pool = create_pool(postgres)
        await pool.open(wait=True)
        try:
            return await read_listing(question, Deps(pool, Embedder.from_settings(postgres), Recipes(),
                                                     Metrics.create()))
        finally:
            await pool.close()
    return asyncio.run(go())


def test_the_timeline_is_every_gist_of_the_conversation_in_time_order(postgres, seeded):
    reply = _listing(postgres, seeded, "timeline")
    assert {i.kind for i in reply.items} == {"gist"} and {i.conversation_id for i in reply.items} == {"conv-a"}
    # Each gist once (the other tenant's conversation of the same id would double them), the near-paraphrase
    # included: a timeline hides nothing.
    assert len(reply.items) == len(KNOWN_OUTPUT["gists"])
    dates = [i.event_date for i in reply.items]
    assert dates == sorted(dates) and [i.rank for i in reply.items] == list(range(1, len(dates) + 1))
    assert any("Alice moved to Lisbon." in i.text for i in reply.items)
    assert reply.used_tokens <= reply.budget_tokens and all(i.line in reply.text for i in reply.items)


def test_the_facts_are_the_current_ones_only(postgres, seeded):
    reply = _listing(postgres, seeded, "facts")
    facts = {i.text for i in reply.items}
    assert {i.kind for i in reply.items} == {"fact"} and all(i.current for i in reply.items)
    assert "Alice lives in Lisbon" in facts and "Alice lives in Porto" not in facts
    assert {"Bob adopted Rex", "Alice adopted Miso"} <= facts


def test_a_listing_shows_nothing_of_another_tenant_or_a_missing_conversation(postgres, seeded):
    assert not _listing(postgres, "list-nobody", "timeline").items
    assert not _listing(postgres, seeded, "facts", conversation="conv-none").items


def test_the_budget_cuts_the_timeline_from_its_end(postgres, seeded):
    whole = _listing(postgres, seeded, "timeline")
    cut = _listing(postgres, seeded, "timeline", budget=50)
    assert 0 < len(cut.items) < len(whole.items) and cut.used_tokens <= 50
    assert [i.gist_id for i in cut.items] == [i.gist_id for i in whole.items[: len(cut.items)]]


def test_a_listing_needs_exactly_one_conversation_and_the_context_mode():
    base = {"question_id": "q", "tenant": "t", "question": "timeline", "listing": "timeline"}
    assert check_listing(Question(**base, mode=Mode.CONTEXT, conversation_ids=["a"])) == "a"
    for fields in ({"mode": Mode.CONTEXT}, {"mode": Mode.CONTEXT, "conversation_ids": ["a", "b"]},
                   {"mode": Mode.FAST, "conversation_ids": ["a"]}):
        with pytest.raises(ListingRefused, match="exactly one conversation"):
            check_listing(Question(**base, **fields))
    listed = base | {"listing": "conversations", "page": ConversationPage()}
    assert check_listing(Question(**listed, mode=Mode.CONTEXT)) is None
    with pytest.raises(ListingRefused, match="names no conversation"):
        check_listing(Question(**listed, mode=Mode.CONTEXT, conversation_ids=["a"]))


@pytest.fixture(scope="module")
def conversations(postgres):
    """Tenant A's conversations proj-1, proj-2, proj-3, proj_x (a wildcard in a LIKE) and misc; tenant B's
    proj-15 and proj-2 (between and among A's ids)."""
    run = uuid.uuid4().hex[:8]
    mine, theirs = f"convs-a-{run}", f"convs-b-{run}"
    embedder = Embedder.from_settings(postgres)
    turns = [("Ana", "Hello."), ("Rui", "Hi there.")]
    for tenant, ids in ((mine, ["proj-1", "proj-2", "proj-3", "proj_x", "misc"]), (theirs, ["proj-15", "proj-2"])):
        store_turns(postgres, embedder, [t for c in ids for t in make_turns(tenant, c, turns)])
    return mine


def _page(postgres, tenant: str, **page) -> MemoryContext:
    return _read(postgres, Question(question_id=f"l-{uuid.uuid4()}", tenant=tenant, question="conversations",
                                    mode=Mode.CONTEXT, listing="conversations", page=ConversationPage(**page)))


def _ids(reply: MemoryContext) -> list[str]:
    return [c.conversation_id for c in reply.conversations or []]


def test_the_conversations_listing_pages_by_prefix_and_counts_within_the_tenant(postgres, conversations):
    first = _page(postgres, conversations, prefix="proj-", limit=2, count=True)
    assert _ids(first) == ["proj-1", "proj-2"] and first.more is True
    assert first.total == 3 and all(c.turns == 2 for c in first.conversations or [])  # not tenant B's proj-15
    rest = _page(postgres, conversations, prefix="proj-", limit=2, after="proj-2")
    assert _ids(rest) == ["proj-3"] and rest.more is False and rest.total is None
    assert _ids(_page(postgres, conversations)) == ["misc", "proj-1", "proj-2", "proj-3", "proj_x"]
    assert _ids(_page(postgres, conversations, prefix="proj_")) == ["proj_x"]
    nobody = _page(postgres, f"convs-nobody-{uuid.uuid4().hex[:6]}", count=True)
    assert nobody.conversations == [] and nobody.total == 0
