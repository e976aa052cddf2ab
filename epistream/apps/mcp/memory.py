"""What the MCP server asks of the client, in one place, and the positions it has written. Reads and
writes go through the server's one EpistreamClient (kept for its lifetime, server.py); the events reads
are one-shot calls of epistream.client.api.

Read-your-own-writes: `remember` keeps, per conversation, the Kafka position of the last turn it
produced, and `recall` and `ask` pass those positions on (`after`), so the answer worker reads only
once the ingest side has stored through them. The positions live in the server process, not in an
MCP session: on the 2026-07-28 protocol a streamable-HTTP request carries no session at all, and a
stdio server has one client anyway; the server serves one tenant, so whatever it wrote is that
tenant's, and waiting for another caller's write costs at most the bounded wait.

The positions come from the client's `produce_turns` and go back as the `after` of its `context` and
`ask` (docs/read-your-writes.md); a reply that could not wait for them says so (`incomplete`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from threading import Lock
from typing import Literal

from epistream.client import api
from epistream.client.api import EventBatch, EventCursorError  # noqa: F401  (the server catches it from here)
from epistream.client.session import EpistreamClient
from epistream.contracts.positions import Position
from epistream.contracts.questions import CONTEXT_BUDGET_DEFAULT, CONTEXT_BUDGET_MAX, Question
from epistream.contracts.replies import Answer, MemoryContext
from epistream.contracts.turns import Turn
from epistream.settings.processes import ClientSettings


class Written:
    """The latest position produced for each conversation by this server."""

    def __init__(self) -> None:
        self._latest: dict[str, Position] = {}
        self._lock = Lock()  # tools run concurrently (HTTP); the dict is tiny, the lock never waits long

    def note(self, positions: Mapping[str, Position]) -> None:
        with self._lock:
            for conversation_id, position in positions.items():
                known = self._latest.get(conversation_id)
                # A conversation keeps its partition (it is the key); a later offset supersedes an earlier one.
                if known is None or known.partition != position.partition or position.offset > known.offset:
                    self._latest[conversation_id] = position

    def after(self, conversation_ids: Sequence[str] | None) -> list[Position]:
        """The positions a read of these conversations (None: all of them) must wait for: the latest of
        each partition, since stored through an offset is stored through every earlier one of its
        partition (epistream/storage/watermarks.py); so never more than the topic's partitions, whatever the
        number of conversations (a question carries at most 1,000)."""
        with self._lock:
            wanted = self._latest.values() if conversation_ids is None else (
                self._latest[c] for c in conversation_ids if c in self._latest)
            latest: dict[int, Position] = {}
            for position in wanted:
                if position.partition not in latest or position.offset > latest[position.partition].offset:
                    latest[position.partition] = position
            return sorted(latest.values(), key=lambda p: p.partition)


async def produce(client: EpistreamClient, turns: Sequence[Turn], *,
                  tenant_key: bytes | None) -> dict[str, Position]:
    """Send the turns (signed for their tenant); per conversation, the position of its last one."""
    return await client.produce_turns(turns, tenant_key=tenant_key)


async def read_context(client: EpistreamClient, question: Question, *, after: list[Position], timeout_s: float,
                       tenant_key: bytes | None) -> MemoryContext:
    """The `context` read of `question` (built by arguments.recall_question), once `after` is stored."""
    time_range = question.time_range
    return await client.context(
        tenant=question.tenant, question=question.question,
        budget_tokens=question.budget_tokens or CONTEXT_BUDGET_DEFAULT,
        since=time_range.start if time_range else None, until=time_range.end if time_range else None,
        conversation_ids=question.conversation_ids, asked_at=question.asked_at, timeout_s=timeout_s,
        tenant_key=tenant_key, after=after or None,
    )


async def answer(client: EpistreamClient, question: Question, *, after: list[Position], timeout_s: float,
                 tenant_key: bytes | None) -> Answer:
    """Ask `question` and await its answer, once `after` is stored."""
    return await client.ask(question, timeout_s=timeout_s, tenant_key=tenant_key, after=after or None)


async def read_listing(client: EpistreamClient, *, tenant: str, conversation_id: str,
                       listing: Literal["timeline", "facts"], timeout_s: float,
                       tenant_key: bytes | None) -> MemoryContext:
    """One conversation's timeline or current facts (a resource), as much as the largest budget holds."""
    return await client.context(tenant=tenant, question=listing, budget_tokens=CONTEXT_BUDGET_MAX,
                                conversation_ids=[conversation_id], listing=listing, timeout_s=timeout_s,
                                tenant_key=tenant_key)


async def read_events(settings: ClientSettings, *, tenant: str, after: Mapping[int, int] | None, wait_s: float,
                      limit: int, tenant_key: bytes | None) -> EventBatch:
    """The tenant's events after `after` (None: from now on), at most `limit`, waiting up to `wait_s` for some;
    an EventCursorError where `after` does not fit the topic."""
    return await api.events_after(settings, tenant=tenant, after=after, wait_s=wait_s, limit=limit,
                                  tenant_key=tenant_key)


def events_topic(settings: ClientSettings, tenant: str, tenant_key: bytes | None) -> str:
    return api.events_topic(settings, tenant, tenant_key)


async def forget(client: EpistreamClient, *, tenant: str, conversation_id: str) -> None:
    await client.forget(tenant=tenant, conversation_id=conversation_id)
