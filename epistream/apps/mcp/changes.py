"""Which MCP resources a memory event changes, and whether the resource list changed: pure, so the rules
are tested apart from Kafka and the SDK.

The resources are a conversation's timeline (its gists) and its facts (the current ones). A segment
enriched changes both; a fact superseded changes the facts of the conversation that stated it (the
event is keyed by the conversation whose enrichment superseded it, whose facts change too); a forget
changes both and the list. A conversation enters the list with its first stored turns: the server
cannot tell first turns from later ones without a read, so the first `turns_stored` it sees of a
conversation since it started announces the list changed (one extra, harmless notification for a
conversation that existed before: notifications are level triggers, "read again if you care")."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from epistream.contracts.events import MemoryEvent

#: The resources' URIs: RESOURCES/<conversation id>/timeline and .../facts.
RESOURCES = "epistream://conversations"
ResourceKind = Literal["timeline", "facts"]
KINDS: tuple[ResourceKind, ...] = ("timeline", "facts")
#: The conversations whose first stored turns the server has seen, kept for the most recent ones.
MAX_KNOWN = 10_000
# A fact's id is its segment's id (<conversation>#<seq>) and its ordinal (pipeline/enrich.py, store/segments.py).
_FACT_ID = re.compile(r"^(?P<conversation>.+)#\d{4,}/f\d{2,}$", re.DOTALL)


def uri(conversation_id: str, kind: ResourceKind) -> str:
    return f"{RESOURCES}/{conversation_id}/{kind}"


def resource_of(value: str) -> tuple[str, ResourceKind] | None:
    """The conversation and kind a resource URI names, or None when it names no resource of this server."""
    prefix = RESOURCES + "/"
    if not value.startswith(prefix):
        return None
    conversation, _, kind = value[len(prefix):].rpartition("/")
    if not conversation or kind not in KINDS:
        return None
    return conversation, "timeline" if kind == "timeline" else "facts"


def fact_conversation(fact_id: str) -> str | None:
    """The conversation that stated a fact, from its id; None for an id of another shape."""
    match = _FACT_ID.match(fact_id)
    return None if match is None else match["conversation"]


@dataclass
class Change:
    """What one event changed: these resources, the resource list, and whether every conversation did (a
    whole-tenant forget: `updated` then names those the server knew of)."""

    updated: set[str] = field(default_factory=set)
    listed: bool = False
    everything: bool = False


class KnownConversations:
    """The conversations seen stored since the server started, at most `limit` (the oldest forgotten first)."""

    def __init__(self, limit: int = MAX_KNOWN) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._seen))

    def first_seen(self, conversation_id: str) -> bool:
        """Note the conversation; True when it was not known yet."""
        if conversation_id in self._seen:
            self._seen.move_to_end(conversation_id)
            return False
        self._seen[conversation_id] = None
        if len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return True

    def drop(self, conversation_id: str | None) -> None:
        """Forget one conversation (None: all of them, a whole-tenant forget)."""
        if conversation_id is None:
            self._seen.clear()
        else:
            self._seen.pop(conversation_id, None)


def change_of(event: MemoryEvent, known: KnownConversations) -> Change:
    """The resources `event` changed and whether the list did; `known` is noted (stored) or dropped (forgotten)."""
    conversation = event.conversation_id
    if event.kind == "conversation_forgotten":
        if conversation is None or event.scope == "tenant":
            every = {uri(c, k) for c in known for k in KINDS}
            known.drop(None)
            return Change(every, listed=True, everything=True)
        known.drop(conversation)
        return Change({uri(conversation, k) for k in KINDS}, listed=True)
    if conversation is None:
        return Change()
    if event.kind == "turns_stored":
        return Change(listed=known.first_seen(conversation))
    if event.kind == "segment_enriched":
        return Change({uri(conversation, k) for k in KINDS})
    if event.kind == "fact_superseded":
        owners = {conversation} | {c for c in (fact_conversation(event.fact_id or ""),) if c is not None}
        return Change({uri(c, "facts") for c in owners})
    return Change()  # segment_closed: no gist or fact yet
