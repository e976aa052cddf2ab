"""What the MCP server asks of the client, in one place, and the positions it has written. Reads and
writes go through the server's one EpistreamClient (kept for its lifetime, server.py); the `events` tool's
reads are one-shot calls of epistream.client.api, the notifier's one long-lived reader (watch.py) its
`follow_events`.

Read-your-own-writes: `remember` keeps, per conversation, the Kafka position of the last turn it
produced, and `recall` and `ask` pass those positions on (`after`), so the answer worker reads only
once the ingest side has stored through them. The positions live in the server process, not in an
MCP session: on the 2026-07-28 protocol a streamable-HTTP request carries no session at all, and a
stdio server has one client anyway; the server serves one tenant, so whatever it wrote is that
tenant's, and waiting for another caller's write costs at most the bounded wait.

The positions come from the client's `produce_turns` and go back as the `after` of its `context` and
`ask` (docs/read-your-writes.md); a reply that could not wait for them says so (`incomplete`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from threading import Lock
from typing import Literal

from epistream.client import api
from epistream.client.api import EventBatch, EventCursorError  # noqa: F401  (the server catches it from here)
from epistream.client.session import EpistreamClient, OnProgress
from epistream.contracts.positions import Position
from epistream.contracts.questions import CONTEXT_BUDGET_DEFAULT, CONTEXT_BUDGET_MAX, ConversationPage, Question
from epistream.contracts.replies import Answer, MemoryContext
from epistream.contracts.turns import Turn
from epistream.settings.processes import ClientSettings

#: The conversations `Written` keeps a position of its own for; older ones fold into a per-partition floor.
MAX_CONVERSATIONS = 10_000


class Written:
    """The latest position produced for each conversation by this server, for the `MAX_CONVERSATIONS`
    conversations written last; the positions of those written earlier are folded, per partition, into
    the highest offset any of them reached (a floor). Waiting for a later offset of the same partition is
    never wrong (stored through an offset is stored through every earlier one of its partition), only
    possibly longer, so a server that writes to many conversations holds bounded memory and its reads
    stay right."""

    def __init__(self, max_conversations: int = MAX_CONVERSATIONS) -> None:
        self._latest: OrderedDict[str, Position] = OrderedDict()  # least recently written first
        self._floor: dict[int, Position] = {}  # partition -> the highest position folded out of _latest
        self._max = max_conversations
        self._lock = Lock()  # tools run concurrently (HTTP); the dict is small, the lock never waits long

    def note(self, positions: Mapping[str, Position]) -> None:
        with self._lock:
            for conversation_id, position in positions.items():
                known = self._latest.get(conversation_id)
                # A conversation keeps its partition (it is the key); a later offset supersedes an earlier one.
                if known is None or known.partition != position.partition or position.offset > known.offset:
                    self._latest[conversation_id] = position
                self._latest.move_to_end(conversation_id)
            while len(self._latest) > self._max:
                _, folded = self._latest.popitem(last=False)
                floor = self._floor.get(folded.partition)
                if floor is None or folded.offset > floor.offset:
                    self._floor[folded.partition] = folded

    def __len__(self) -> int:
        return len(self._latest) + len(self._floor)

    def after(self, conversation_ids: Sequence[str] | None) -> list[Position]:
        """The positions a read of these conversations (None: all of them) must wait for: the latest of
        each partition, since stored through an offset is stored through every earlier one of its
        partition (epistream/storage/watermarks.py); so never more than the topic's partitions, whatever the
        number of conversations (a question carries at most 1,000). A conversation folded into the
        floors waits for them."""
        with self._lock:
            wanted = list(self._latest.values() if conversation_ids is None else (
                self._latest[c] for c in conversation_ids if c in self._latest))
            if conversation_ids is None or any(c not in self._latest for c in conversation_ids):
                wanted += self._floor.values()
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
                 tenant_key: bytes | None, on_progress: OnProgress | None = None) -> Answer:
    """Ask `question` and await its answer, once `after` is stored; with `on_progress`, the worker's steps
    are handed to it as they come (progress.py)."""
    return await client.ask(question, timeout_s=timeout_s, tenant_key=tenant_key, after=after or None,
                            on_progress=on_progress)


async def read_listing(client: EpistreamClient, *, tenant: str, conversation_id: str,
                       listing: Literal["timeline", "facts"], timeout_s: float,
                       tenant_key: bytes | None) -> MemoryContext:
    """One conversation's timeline or current facts (a resource), as much as the largest budget holds."""
    return await client.context(tenant=tenant, question=listing, budget_tokens=CONTEXT_BUDGET_MAX,
                                conversation_ids=[conversation_id], listing=listing, timeout_s=timeout_s,
                                tenant_key=tenant_key)


async def read_conversations(client: EpistreamClient, *, tenant: str, page: ConversationPage, timeout_s: float,
                             tenant_key: bytes | None) -> MemoryContext:
    """A page of the tenant's conversations (the resource list, completions): the conversations listing."""
    return await client.context(tenant=tenant, question="conversations", listing="conversations", page=page,
                                timeout_s=timeout_s, tenant_key=tenant_key)


async def read_events(settings: ClientSettings, *, tenant: str, after: Mapping[int, int] | None, wait_s: float,
                      limit: int, tenant_key: bytes | None) -> EventBatch:
    """The tenant's events after `after` (None: from now on), at most `limit`, waiting up to `wait_s` for some;
    an EventCursorError where `after` does not fit the topic."""
    return await api.events_after(settings, tenant=tenant, after=after, wait_s=wait_s, limit=limit,
                                  tenant_key=tenant_key)


def follow_events(settings: ClientSettings, *, tenant: str, after: Mapping[int, int] | None,
                  tenant_key: bytes | None) -> AsyncIterator[EventBatch]:
    """The tenant's events after `after` (None: from now on) as they come, through one consumer while iterated."""
    return api.follow_events(settings, tenant=tenant, after=after, tenant_key=tenant_key)


def events_topic(settings: ClientSettings, tenant: str, tenant_key: bytes | None) -> str:
    return api.events_topic(settings, tenant, tenant_key)


async def forget(client: EpistreamClient, *, tenant: str, conversation_id: str) -> None:
    await client.forget(tenant=tenant, conversation_id=conversation_id)
