"""Assistants: small models that each read one activated segment (or a reading window around
the best turns, consumers/windows.py) and quote the evidence in it, in parallel over a pool of OpenAI-compatible endpoints (vLLM
replicas in production).

A segment always goes to the same endpoint (rendezvous hashing over the pool),
and its text leads the prompt, so a replica's prefix cache serves the second
question about the same segment without re-reading it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from psycopg import AsyncConnection

from epistream.core import tracing
from epistream.errors import EpistreamError
from epistream.models.llm import ModelClient, Usage
from epistream.models.prompts import fence, turn_line

from .prompts import ASSISTANT_PROMPT, AssistantReply
from .retrieval import load_turns
from .router import OPEN_SUFFIX, RoutedSegment

log = logging.getLogger(__name__)

_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class SegmentTurnText:
    turn_id: str
    speaker: str
    text: str
    ts: datetime
    segment_id: str | None = None  # a reading window's turn: the segment it is in (else the text's own)


@dataclass(frozen=True)
class SegmentText:
    segment_id: str
    conversation_id: str
    turns: list[SegmentTurnText]


@dataclass(frozen=True)
class QuotedTurn:
    segment_id: str
    conversation_id: str
    turn_id: str
    speaker: str
    quote: str
    time: datetime


@dataclass(frozen=True)
class Reading:
    segment_id: str
    endpoint: str
    quotes: list[QuotedTurn]
    usage: Usage
    error: str | None = None


def pick_endpoint(segment_id: str, endpoints: list[str]) -> int:
    """Rendezvous hashing: stable per segment, and only 1/n of segments move when a replica joins."""
    def weight(endpoint: str) -> int:
        return int.from_bytes(hashlib.sha256(f"{endpoint}\x1f{segment_id}".encode()).digest()[:8], "big")
    return max(range(len(endpoints)), key=lambda i: weight(endpoints[i]))


async def load_segments(conn: AsyncConnection, tenant: str, routed: list[RoutedSegment]) -> list[SegmentText]:
    texts = []
    for segment in routed:
        found = await load_turns(conn, tenant=tenant, conversation_id=segment.conversation_id,
                                 turn_ids=segment.turn_ids)
        turns = [SegmentTurnText(t.turn_id, t.speaker, t.text, t.ts) for t in found]
        if turns:
            texts.append(SegmentText(segment.segment_id, segment.conversation_id, turns))
    return texts


def segment_prompt(segment: SegmentText) -> str:
    return fence("segment", "\n".join(turn_line(t) for t in segment.turns))


def build_messages(segment: SegmentText, question: str) -> list[dict[str, str]]:
    # The segment leads and the question trails: the shared prefix is what a replica caches.
    return [
        {"role": "system", "content": ASSISTANT_PROMPT.template},
        {"role": "user", "content": f"{segment_prompt(segment)}\n\nQuestion: {question}"},
    ]


def _normal(text: str) -> str:
    return _SPACES.sub(" ", text.lower()).strip(" .,!?;:\"'")


def verify(reply: AssistantReply, segment: SegmentText) -> list[QuotedTurn]:
    """Keep quotes that really are in the segment (word for word, up to case and
    spacing), attributed to the turn that contains them; drop the rest."""
    quotes: list[QuotedTurn] = []
    by_id = {t.turn_id: t for t in segment.turns}
    for item in reply.evidence if reply.relevant else []:
        wanted = _normal(item.quote)
        if not wanted:
            continue
        claimed = by_id.get(item.turn_id)
        candidates = ([claimed] if claimed else []) + [t for t in segment.turns if t is not claimed]
        turn = next((t for t in candidates if wanted in _normal(t.text)), None)
        if turn is None:
            continue
        if any(q.turn_id == turn.turn_id and q.quote == item.quote.strip() for q in quotes):
            continue
        quotes.append(QuotedTurn(turn.segment_id or segment.segment_id, segment.conversation_id, turn.turn_id,
                                 turn.speaker, item.quote.strip(), turn.ts))
    return quotes


class AssistantPool:
    """One ModelClient per endpoint, a bound on reads in flight, failures isolated per segment."""

    def __init__(self, clients: list[ModelClient], *, concurrency: int, max_tokens: int) -> None:
        if not clients:
            raise ValueError("an assistant pool needs at least one endpoint")
        self._clients = clients
        self._endpoints = [c.endpoint_label for c in clients]
        self._limit = asyncio.Semaphore(concurrency)
        self._max_tokens = max_tokens

    def endpoint_for(self, segment_id: str) -> ModelClient:
        return self._clients[pick_endpoint(segment_id.removesuffix(OPEN_SUFFIX), self._endpoints)]

    async def read(self, segment: SegmentText, question: str) -> Reading:
        client = self.endpoint_for(segment.segment_id)
        async with self._limit:
            with tracing.span("assistant read", attributes={"epistream.segment_id": segment.segment_id,
                                                            "server.address": client.endpoint_label}) as current:
                try:
                    result = await client.complete_json(build_messages(segment, question), ASSISTANT_PROMPT.schema,
                                                        max_tokens=self._max_tokens)
                except EpistreamError as exc:
                    # One failed read must not sink the question: the others may hold the answer.
                    log.warning("assistant read of %s failed: %s", segment.segment_id, type(exc).__name__)
                    tracing.set_attributes(current, {"error.type": type(exc).__name__})
                    return Reading(segment.segment_id, client.endpoint_label, [], Usage(), f"{type(exc).__name__}")
                reading = Reading(segment.segment_id, client.endpoint_label, verify(result.value, segment), result.usage)
                tracing.set_attributes(current, {"epistream.quotes": len(reading.quotes)})
        return reading

    async def read_all(self, segments: list[SegmentText], question: str,
                       on_read: Callable[[], None] | None = None) -> list[Reading]:
        """Every segment read in parallel, in the segments' order; `on_read` is called as each read ends."""
        async def read(segment: SegmentText) -> Reading:
            reading = await self.read(segment, question)
            if on_read is not None:
                on_read()
            return reading
        return list(await asyncio.gather(*(read(s) for s in segments)))
