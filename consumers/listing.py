"""A conversation's memory as a listing, not a ranking: its gists in the order things happened (the
timeline) or its current facts, packed into the question's budget as a `context` reply; or the tenant's
conversations, a page of them in id order (what the MCP server lists and completes).

A `context` question of one conversation with ``listing`` set asks for it (the MCP server's resources do): the answer
worker reads it under the tenant's row-level security like every other read, so a client reaches
these without a database login of its own. The rows come in time order, the earliest first, and the
packing keeps them in that order until the budget is spent."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncConnection, sql

from epistream.contracts.questions import CONTEXT_BUDGET_DEFAULT, ConversationPage, Mode, Question
from epistream.contracts.replies import MemoryContext
from epistream.errors import ContractError
from epistream.storage.db import tenant_scope

from .context import MetricDeps
from .packing import Candidate, fact_candidate, gist_candidate, pack
from .retrieval import GistRow, StatedFact
from .retrieval.conversations import conversations_page
from .retrieval.execute import typed_rows

#: Most rows read for one listing: far more than the largest budget (32,000 tokens) holds.
LISTING_ROWS = 2_000

TIMELINE = sql.SQL("""
SELECT g.gist_id, g.conversation_id, g.segment_id, g.text, g.event_date, g.date_precision, g.turn_ids, g.said_at,
       0.0 AS distance
FROM memory.gists g
WHERE g.tenant = %(tenant)s AND g.conversation_id = %(conversation)s
ORDER BY g.event_date, g.said_at, g.ordinal, g.gist_id
LIMIT %(limit)s
""")

# memory.current_facts is the one definition of "current" (a later statement about the same subject and
# predicate, in any conversation of the tenant, supersedes a fact).
CURRENT_FACTS = sql.SQL("""
SELECT f.fact_id, f.conversation_id, f.segment_id, s.name AS subject, f.predicate, o.name AS object,
       f.point_in_time, f.start_time, f.end_time, f.turn_ids, f.said_at, true AS current
FROM memory.current_facts f
JOIN memory.entities s ON s.tenant = f.tenant AND s.entity_id = f.subject_id
JOIN memory.entities o ON o.tenant = f.tenant AND o.entity_id = f.object_id
WHERE f.tenant = %(tenant)s AND f.conversation_id = %(conversation)s
ORDER BY coalesce(f.point_in_time, f.start_time, f.said_at::date), f.said_at, f.fact_id
LIMIT %(limit)s
""")


class ListingRefused(ContractError):
    """A listing asked of another mode than `context`, or of other conversations than it lists."""


def check_listing(question: Question) -> str | None:
    """The conversation a listing question lists (None: the conversations listing, which names none);
    refused (dead-lettered, the asker told why) unless it is a `context` question of exactly one
    conversation (of none, for the conversations listing): a listing another mode would ignore is refused."""
    if question.listing == "conversations":
        if question.mode is not Mode.CONTEXT or question.conversation_ids:
            raise ListingRefused("the conversations listing is a context read that names no conversation")
        return None
    if question.mode is not Mode.CONTEXT or len(question.conversation_ids or ()) != 1:
        raise ListingRefused("a listing is a context read of exactly one conversation (one conversation_ids entry)")
    assert question.conversation_ids is not None
    return question.conversation_ids[0]


async def _listed(conn: AsyncConnection, listing: str | None, params: dict[str, Any]) -> list[Candidate]:
    """The listing's rows as candidates, each ranked by its place in time (rank 1: the earliest; rrf_k 0
    keeps the scores readable)."""
    if listing == "timeline":
        gists = await typed_rows(conn, GistRow, TIMELINE, params)
        return [gist_candidate(row, n, 0) for n, row in enumerate(gists, start=1)]
    facts = await typed_rows(conn, StatedFact, CURRENT_FACTS, params)
    return [fact_candidate(row, n, 0) for n, row in enumerate(facts, start=1)]


async def read_listing(question: Question, deps: MetricDeps) -> MemoryContext:
    """The reply to a question with ``listing``: its one conversation's timeline or current facts, in
    time order, within its budget; or a page of the tenant's conversations."""
    started = time.perf_counter()
    conversation = check_listing(question)
    budget = question.budget_tokens or CONTEXT_BUDGET_DEFAULT
    reply = MemoryContext(question_id=question.question_id, tenant=question.tenant,
                          asked_at=question.asked_at or datetime.now(UTC), items=[], text="", budget_tokens=budget,
                          used_tokens=0, latency_ms=0.0)
    async with deps.read_pool.connection() as conn, tenant_scope(conn, question.tenant):
        if conversation is None:
            entries, more, total = await conversations_page(conn, question.tenant, question.page or ConversationPage())
            reply = reply.model_copy(update={"conversations": entries, "more": more, "total": total})
        else:
            params: dict[str, Any] = {"tenant": question.tenant, "conversation": conversation, "limit": LISTING_ROWS}
            packed = pack(await _listed(conn, question.listing, params), budget)
            reply = reply.model_copy(update={"items": packed.items, "text": packed.text,
                                             "used_tokens": packed.used_tokens})
    reply = reply.model_copy(update={"latency_ms": round((time.perf_counter() - started) * 1000, 2)})
    answered = reply.items or reply.conversations
    deps.metrics.questions_answered.labels("context", "answered" if answered else "empty").inc()
    return reply
