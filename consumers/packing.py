"""The context read's pure half: memory rows as candidates (each with its line), one ranking
across kinds, deduplication, and greedy packing into a token budget.

Ranking is reciprocal-rank fusion over every pathway: a turn brings the fused score of its
dense and lexical ranks (computed in SQL, consumers/retrieval/turns.py), a gist 1/(k + its rank
by meaning), a fact 1/(k + its rank among the facts about the question's entities). Packing walks
the ranking best first and takes each item whose line still fits; a line is numbered by its rank.

The text block is in time order, under one header per day (and conversation, when the items come
from more than one): "# 2023-05-08 Monday" then "[3] 13:56 Caroline: ...". A date on every line
cost about five tokens more a turn, a sixth of a short turn. Costs are counted on exactly the text
the reader gets, headers included (``Block``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta, timezone
from functools import lru_cache
from typing import Any

from epistream.contracts.replies import MemoryItem, ResolvedPeriod
from epistream.core.dates import relative_dates
from epistream.models.prompts import estimate_tokens

from .retrieval import GistRow, RetrievedTurn, StatedFact, reciprocal_rank
from .timefilter import period_of

#: What one newline between two lines of the text block is counted as.
SEPARATOR_TOKENS = 1
#: Below this many tokens left, no line fits ("[n] " and a date alone take more): stop packing.
MIN_LINE_TOKENS = 4
#: Ties in score go to turns (the verbatim memory), then gists, then facts.
_KIND_ORDER = {"turn": 0, "gist": 1, "fact": 2}


@dataclass(frozen=True)
class Candidate:
    """An item before packing: what identifies it (``key``, for deduplication), its fused
    score, the line body (without its number or day) and the MemoryItem fields it carries
    (``fields``: packing's own; other modules read them through the properties)."""

    key: tuple[Any, ...]
    score: float
    body: str
    fields: dict[str, Any] = field(hash=False)
    #: False for a turn whose relative dates are not resolved yet (``with_dates``): resolving costs about
    #: 0.05 ms a turn, and most of the hundred candidates never fit, so pack resolves only those that may.
    dated: bool = True

    @property
    def kind(self) -> str:
        return str(self.fields["kind"])

    @property
    def conversation_id(self) -> str:
        return str(self.fields["conversation_id"])

    @property
    def time(self) -> datetime:
        """When it was said (a turn: in its speaker's offset)."""
        time: datetime = self.fields["time"]
        return time

    @property
    def text(self) -> str:
        return str(self.fields["text"])

    @property
    def turn_ids(self) -> list[str]:
        """The turns it comes from (a turn: itself)."""
        return list(self.fields["turn_ids"])

    @property
    def dates(self) -> list[ResolvedPeriod]:
        """The relative dates a turn uses, once resolved (``with_dates``)."""
        return list(self.fields.get("dates", []))

    @property
    def day(self) -> date:
        """The day its line is shown under (as item_day)."""
        return self.time.date()

    def plus(self, name: str, amount: float) -> Candidate:
        """The candidate with ``amount`` added to its score, shown among its scores as ``name``."""
        return replace(self, score=self.score + amount,
                       fields={**self.fields, "scores": {**self.fields["scores"], name: amount}})


def item_day(item: MemoryItem) -> date:
    """The day an item's line is shown under: when it was said (a turn: in its speaker's offset)."""
    return item.time.date()


def day_header(day: date, conversation_id: str | None) -> str:
    return f"# {day:%Y-%m-%d %A}" + (f", {conversation_id}" if conversation_id else "")


class Block:
    """What a text block of some items costs, kept as items are added (packing asks per candidate).

    Lines, one header per (conversation, day), one separator per newline; the headers name the
    conversation once the items come from more than one."""

    def __init__(self) -> None:
        self.line_tokens = 0
        self.lines = 0
        self.days: dict[tuple[str, date], tuple[int, int]] = {}  # -> header tokens (plain, named)
        self.conversations: set[str] = set()
        self._plain = 0
        self._named = 0

    @staticmethod
    @lru_cache(maxsize=4096)  # asked for every candidate whose day is not in the block yet, kept or skipped
    def _header_costs(conversation_id: str, day: date) -> tuple[int, int]:
        return estimate_tokens(day_header(day, None)), estimate_tokens(day_header(day, conversation_id))

    def tokens_with(self, conversation_id: str | None = None, day: date | None = None, tokens: int = 0) -> int:
        """The block's tokens, with a line of ``tokens`` said on ``day`` in ``conversation_id`` when given."""
        lines, days, plain, named = self.lines, len(self.days), self._plain, self._named
        several = len(self.conversations) > 1
        if conversation_id is not None and day is not None:
            lines += 1
            several = several or bool(self.conversations - {conversation_id})
            if (conversation_id, day) not in self.days:
                extra_plain, extra_named = self._header_costs(conversation_id, day)
                days, plain, named = days + 1, plain + extra_plain, named + extra_named
        if not lines:
            return 0
        return self.line_tokens + tokens + (named if several else plain) + SEPARATOR_TOKENS * (lines + days - 1)

    def add(self, conversation_id: str, day: date, tokens: int) -> None:
        key = (conversation_id, day)
        if key not in self.days:
            self.days[key] = self._header_costs(conversation_id, day)
            self._plain += self.days[key][0]
            self._named += self.days[key][1]
        self.conversations.add(conversation_id)
        self.lines += 1
        self.line_tokens += tokens


def render(items: Sequence[MemoryItem]) -> str:
    """The text block: the items in time order under their day headers (see the module doc)."""
    named = len({i.conversation_id for i in items}) > 1
    ordered = sorted(items, key=lambda i: (item_day(i), i.conversation_id, i.time, _KIND_ORDER[i.kind], i.rank))
    lines: list[str] = []
    shown: tuple[str, date] | None = None
    for item in ordered:
        key = (item.conversation_id, item_day(item))
        if key != shown:
            lines.append(day_header(key[1], key[0] if named else None))
            shown = key
        lines.append(item.line)
    return "\n".join(lines)


def used_tokens(items: Sequence[MemoryItem]) -> int:
    """What ``render(items)`` is counted as (>= estimate_tokens of it)."""
    block = Block()
    for item in items:
        block.add(item.conversation_id, item_day(item), item.tokens)
    return block.tokens_with()


@dataclass(frozen=True)
class Packed:
    items: list[MemoryItem]
    used_tokens: int

    @property
    def text(self) -> str:
        return render(self.items)


def period_text(period: ResolvedPeriod) -> str:
    return period.start.isoformat() if period.start == period.end else f"{period.start}..{period.end}"


def _said_dates(text: str, said: datetime) -> list[ResolvedPeriod]:
    periods = (period_of(expression, resolved) for expression, resolved in relative_dates(text, said))
    return [p for p in periods if p is not None]


@lru_cache(maxsize=256)
def _offset(seconds: int) -> timezone:
    return timezone(timedelta(seconds=seconds))


def turn_candidate(turn: RetrievedTurn, *, score: float | None = None,
                   scores: dict[str, float] | None = None) -> Candidate:
    """A turn, verbatim, at its speaker's local time; the relative dates it uses are resolved after it
    when it is packed (``with_dates``). ``score`` and ``scores``: a derived turn's own (else the search's).
    Built for every turn a read finds (hundreds a read): kept plain."""
    local = turn.ts.astimezone(_offset(turn.tz_offset_s))
    body = f"{local.hour:02d}:{local.minute:02d} {turn.speaker}: {turn.text}"
    if scores is None:
        scores = {"rrf": turn.score}
        if turn.dense_rank is not None:
            scores["dense_rank"] = float(turn.dense_rank)
        if turn.lexical_rank is not None:
            scores["lexical_rank"] = float(turn.lexical_rank)
    return Candidate(
        key=("turn", turn.conversation_id, turn.turn_id), score=turn.score if score is None else score, body=body,
        fields={"kind": "turn", "conversation_id": turn.conversation_id, "segment_id": turn.segment_id,
                "turn_id": turn.turn_id,
                "turn_ids": [turn.turn_id], "speaker": turn.speaker, "text": turn.text, "time": local,
                "dates": [], "scores": scores},
        dated=False,
    )


def with_dates(candidate: Candidate) -> Candidate:
    """A turn candidate with the relative dates it uses resolved, after its line ("[yesterday = ...]")."""
    if candidate.dated:
        return candidate
    dates = _said_dates(candidate.text, candidate.time)
    body = candidate.body
    if dates:
        body += " [" + "; ".join(f"{p.expression} = {period_text(p)}" for p in dates) + "]"
    return replace(candidate, body=body, fields={**candidate.fields, "dates": dates}, dated=True)


def neighbour_candidate(turn: RetrievedTurn, seed: Candidate, seed_rank: int, share: float) -> Candidate:
    """A turn beside a strong hit, ranked just below it (``share`` of its score): the answer to a
    question, or the follow-up of a statement, is often the next turn and shares none of its words."""
    # Which side of its seed it is on (the learned ranker reads it: an answer follows its question).
    return _derived(turn, seed, share, "neighbour_of", seed_rank, after_seed=float(turn.ts > seed.time))


def source_candidate(turn: RetrievedTurn, origin: Candidate, origin_rank: int, share: float) -> Candidate:
    """A turn a well-ranked gist (or fact) was written from, ranked just below it: the gist found it by
    its absolute date or its summary words, the fact by the entity the question names, and the turn
    is the verbatim memory."""
    return _derived(turn, origin, share, f"source_of_{origin.kind}", origin_rank)


def _derived(turn: RetrievedTurn, origin: Candidate, share: float, relation: str, origin_rank: int,
             **more: float) -> Candidate:
    score = origin.score * share
    return turn_candidate(turn, score=score, scores={"rrf": score, relation: float(origin_rank), **more})


def gist_candidate(row: GistRow, rank: int, rrf_k: int) -> Candidate:
    """A gist (its sentence starts with its absolute date), ranked by meaning."""
    score = reciprocal_rank(rank, rrf_k)
    return Candidate(
        # The same sentence from two overlapping segments is one item.
        key=("gist", row.conversation_id, " ".join(row.text.lower().split())), score=score,
        body=f"gist: {row.text}",
        fields={"kind": "gist", "conversation_id": row.conversation_id, "segment_id": row.segment_id,
                "gist_id": row.gist_id, "turn_ids": list(row.turn_ids), "text": row.text,
                "time": row.said_at, "event_date": row.event_date, "date_precision": row.date_precision,
                "scores": {"rrf": score, "dense_rank": float(rank), "dense": 1.0 - float(row.distance)}},
    )


def fact_span(point: date | None, start: date | None, end: date | None) -> str:
    if point:
        return f"on {point}"
    if start or end:
        return f"from {start or '?'} to {end or 'now'}"
    return "time not stated"


def fact_candidate(row: StatedFact, rank: int, rrf_k: int) -> Candidate:
    """A temporal fact about an entity the question names; a superseded one says so."""
    score = reciprocal_rank(rank, rrf_k)
    quote = f"{row.subject} {row.predicate.replace('_', ' ')} {row.object}"
    status = "" if row.current else "; superseded"
    body = f"fact: {quote}, {fact_span(row.point_in_time, row.start_time, row.end_time)}{status}"
    return Candidate(
        # One statement from two overlapping segments is one fact.
        key=("fact", row.conversation_id, quote, row.point_in_time, row.start_time, row.end_time, row.said_at),
        score=score, body=body,
        fields={"kind": "fact", "conversation_id": row.conversation_id, "segment_id": row.segment_id,
                "fact_id": row.fact_id, "turn_ids": list(row.turn_ids), "text": quote, "time": row.said_at,
                "point_in_time": row.point_in_time, "start_time": row.start_time, "end_time": row.end_time,
                "current": bool(row.current), "scores": {"rrf": score, "entity_rank": float(rank)}},
    )


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Best first (score, then turns before gists before facts, then key), each key once."""
    ordered = sorted(candidates, key=lambda c: (-c.score, _KIND_ORDER[c.kind], repr(c.key)))
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for candidate in ordered:
        if candidate.key not in seen:
            seen.add(candidate.key)
            unique.append(candidate)
    return unique


def pack(ranked: Sequence[Candidate], budget_tokens: int) -> Packed:
    """Greedily, best first: every item whose numbered line (and its day's header, if new) still
    fits the budget. A line too long for what is left is skipped, not cut."""
    items: list[MemoryItem] = []
    block = Block()
    for candidate in ranked:
        conversation_id, day = candidate.conversation_id, candidate.day
        # The line without its resolved dates is never longer: when even it does not fit, skip unresolved.
        if block.tokens_with(conversation_id, day, estimate_tokens(f"[{len(items) + 1}] {candidate.body}")) > budget_tokens:
            continue
        candidate = with_dates(candidate)
        line = f"[{len(items) + 1}] {candidate.body}"
        tokens = estimate_tokens(line)
        if block.tokens_with(conversation_id, day, tokens) > budget_tokens:
            continue
        items.append(MemoryItem(**candidate.fields, rank=len(items) + 1, line=line, tokens=tokens))
        block.add(conversation_id, day, tokens)
        if budget_tokens - block.tokens_with() < MIN_LINE_TOKENS:
            break
    return Packed(items, block.tokens_with())
