"""What the tools find, typed: gists, turns, entities, facts, a gist's contexts,
an entity query's facts, a segment. Each gist, turn and fact knows the evidence
it is, keyed by the id a model cites it with."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from epistream.contracts.replies import Evidence

from ..retrieval import Fact, Gist, TurnRow

Cited = dict[str, Evidence]  # citable id (gist_id, fact_id, turn_id) -> evidence, in the order shown


@dataclass(frozen=True)
class GistHit(Gist):
    score: float | None = None  # cosine similarity (semantic) or ts_rank_cd (lexical)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> GistHit:
        return cls(
            gist_id=row["gist_id"], conversation_id=row["conversation_id"], segment_id=row["segment_id"],
            text=row["text"], event_date=row["event_date"], date_precision=row["date_precision"],
            turn_ids=list(row["turn_ids"]), said_at=row["said_at"], score=row.get("score"),
        )

    def evidence(self) -> Cited:
        return {self.gist_id: Evidence(conversation_id=self.conversation_id, segment_id=self.segment_id,
                                       turn_ids=list(self.turn_ids), quote=self.text, time=self.said_at)}


@dataclass(frozen=True)
class TurnHit:
    conversation_id: str
    turn_id: str
    speaker: str
    text: str
    ts: datetime  # with the speaker's UTC offset
    session_id: str | None
    segment_id: str | None = None  # the first segment holding the turn, for read_segment
    score: float | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TurnHit:
        offset = timezone(timedelta(seconds=row.get("tz_offset_s") or 0))
        return cls(
            conversation_id=row["conversation_id"], turn_id=row["turn_id"], speaker=row["speaker"],
            text=row["text"], ts=row["ts"].astimezone(offset), session_id=row["session_id"],
            segment_id=row.get("segment_id"), score=row.get("score"),
        )

    @classmethod
    def of(cls, turn: TurnRow) -> TurnHit:
        """A stored turn (retrieval.load_turns) at its speaker's offset; no segment or score was read with it."""
        return cls(conversation_id=turn.conversation_id, turn_id=turn.turn_id, speaker=turn.speaker, text=turn.text,
                   ts=turn.ts.astimezone(timezone(timedelta(seconds=turn.tz_offset_s))), session_id=turn.session_id)

    def evidence(self) -> Cited:
        if not self.text:
            return {}
        return {self.turn_id: Evidence(conversation_id=self.conversation_id, segment_id=self.segment_id,
                                       turn_ids=[self.turn_id], quote=self.text, time=self.ts,
                                       speaker=self.speaker)}


@dataclass(frozen=True)
class EntityRef:
    entity_id: str
    name: str
    aliases: list[str]


@dataclass(frozen=True)
class GistContexts:
    gist: GistHit
    source_turns: list[TurnHit]
    before: list[GistHit]  # up to `window` earlier gists of the conversation, oldest first
    after: list[GistHit]  # up to `window` later gists, oldest first
    entities: list[EntityRef]
    similar: list[GistHit]  # cosine above the card's similar threshold, most similar first; score = cosine

    def evidence(self) -> Cited:
        return cited([self.gist, *self.source_turns, *self.before, *self.after, *self.similar])


@dataclass(frozen=True)
class FactRow(Fact):
    def evidence(self) -> Cited:
        return {self.fact_id: Evidence(
            conversation_id=self.conversation_id, segment_id=self.segment_id, turn_ids=list(self.turn_ids),
            quote=f"{self.subject} {self.predicate} {self.object}", time=self.said_at)}


@dataclass(frozen=True)
class EntityContexts:
    facts: list[FactRow]  # the page (limit/offset); one fact for first/last
    total: int  # facts matching the filters, before limit/offset
    aggregate: str
    count: int | None  # aggregate "count": equals total
    subjects: list[str]  # entity names the subject text matched
    objects: list[str]
    predicates: list[str]  # predicates the predicate text matched

    def evidence(self) -> Cited:
        return cited(self.facts)


@dataclass(frozen=True)
class SegmentRead:
    segment_id: str
    conversation_id: str
    seq: int
    start_ts: datetime
    end_ts: datetime
    status: str
    summary: str | None
    raw_text: str
    turns: list[TurnHit]

    def evidence(self) -> Cited:
        return cited(self.turns)


def cited(items: Iterable[GistHit | TurnHit | FactRow]) -> Cited:
    """The evidence of ``items``, in order; an id seen twice keeps its first place and evidence."""
    found: Cited = {}
    for item in items:
        for key, evidence in item.evidence().items():
            found.setdefault(key, evidence)
    return found
