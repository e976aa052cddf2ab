"""What one enrichment produces, as the rows store.memory writes: shared by the two, so
neither imports the other's module for a type."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime


@dataclass(frozen=True)
class GistRow:
    gist_id: str
    ordinal: int
    text: str
    event_date: date
    precision: str
    turn_ids: tuple[str, ...]
    said_at: datetime


@dataclass(frozen=True)
class FactRow:
    fact_id: str
    ordinal: int
    subject: str
    predicate: str
    object: str
    point_in_time: date | None
    start_time: date | None
    end_time: date | None
    turn_ids: tuple[str, ...]
    said_at: datetime


@dataclass(frozen=True)
class Enrichment:
    summary: str
    gists: list[GistRow]
    facts: list[FactRow]
    #: normalised name -> surface form, for every entity this segment mentions
    entities: dict[str, str]
    #: gist id -> normalised names of the entities it mentions
    mentions: dict[str, list[str]]
