"""The structured memory a context read takes: the gists nearest the question, and the facts
about entities it names (whole words of the normalised question), current ones only unless the
question asks about the past, both within the read's time window (as days, either end open)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime

import numpy as np
from psycopg import AsyncConnection, sql

from epistream.core import tracing

from .execute import typed_rows
from .fragments import conversations, fact_days, gist_days, in_scope, nearest, overlaps_window, span_columns

NEAREST_GISTS = nearest("gists", "g", sql.SQL(
    "g.gist_id, g.conversation_id, g.segment_id, g.text, g.event_date, g.date_precision, g.turn_ids, g.said_at, {span}"
    ).format(span=span_columns(*gist_days("g"))),
    sql.SQL("{scope} AND {in_window}").format(scope=in_scope("g"), in_window=overlaps_window(*gist_days("g"), "day")))

# A fact is current when memory.current_facts (the one definition of "current") holds it: the
# subquery names its subject and predicate, which the view's DISTINCT ON lets PostgreSQL push down.
FACTS_NAMED = sql.SQL("""
WITH named AS (
    SELECT f.fact_id, f.conversation_id, f.segment_id, s.name AS subject, f.predicate, o.name AS object,
           f.point_in_time, f.start_time, f.end_time, f.turn_ids, f.said_at, {span},
           f.fact_id IN (SELECT c.fact_id FROM memory.current_facts c
                         WHERE c.tenant = f.tenant AND c.subject_id = f.subject_id AND c.predicate = f.predicate)
               AS current
    FROM memory.facts f
    JOIN memory.entities s ON s.tenant = f.tenant AND s.entity_id = f.subject_id
    JOIN memory.entities o ON o.tenant = f.tenant AND o.entity_id = f.object_id
    WHERE {scope} AND {in_window}
      AND ((length(s.normalized_name) > 2 AND %(padded)s LIKE '%% ' || s.normalized_name || ' %%')
        OR (length(o.normalized_name) > 2 AND %(padded)s LIKE '%% ' || o.normalized_name || ' %%'))
)
SELECT * FROM named
WHERE %(with_superseded)s OR current
ORDER BY said_at DESC, fact_id LIMIT %(limit)s
""").format(scope=in_scope("f"), in_window=overlaps_window(*fact_days("f"), "day"), span=span_columns(*fact_days("f")))
_NON_WORD = re.compile(r"[^\w\s]+")


@dataclass(frozen=True)
class Gist:
    """A gist as the reads select it (fragments.GIST_FIELDS); the tools' hits extend it too."""

    gist_id: str
    conversation_id: str
    segment_id: str
    text: str
    event_date: date
    date_precision: str
    turn_ids: list[str]
    said_at: datetime


@dataclass(frozen=True)
class GistRow(Gist):
    """A gist as a context reply shows it, with its ``distance`` from the question (a listing: 0)."""

    distance: float


@dataclass(frozen=True)
class NearGist(GistRow):
    """A row of NEAREST_GISTS: the gist and the days its event stands for, as the window filter reads
    them (never open: a gist's event always has a date)."""

    first_day: date
    last_day: date


@dataclass(frozen=True)
class Fact:
    """A fact as the reads select it, its subject and object by name; the tools' fact rows extend it too."""

    fact_id: str
    conversation_id: str
    segment_id: str
    subject: str
    predicate: str
    object: str
    point_in_time: date | None
    start_time: date | None
    end_time: date | None
    said_at: datetime
    turn_ids: list[str]


@dataclass(frozen=True)
class StatedFact(Fact):
    """A fact as a context reply shows it, and whether it is ``current`` (no later statement superseded it)."""

    current: bool


@dataclass(frozen=True)
class NamedFact(StatedFact):
    """A row of FACTS_NAMED: a fact about an entity the question names, and the days it held
    (``first_day`` / ``last_day``, as the window filter reads them; None: open)."""

    first_day: date | None
    last_day: date | None


def padded_words(question: str) -> str:
    """The question lower-cased, punctuation as spaces, one space around each word."""
    return f" {' '.join(_NON_WORD.sub(' ', question.lower()).split())} "


@tracing.traced("retrieve gists", {"epistream.pathways": "dense"})
async def nearest_gists(conn: AsyncConnection, *, tenant: str, vector: np.ndarray,
                        conversation_ids: list[str] | None, limit: int,
                        first_day: date | None = None, last_day: date | None = None) -> list[NearGist]:
    """The gists nearest ``vector`` whose event meets the days [first_day, last_day], with ``distance``
    and their event's own ``first_day`` / ``last_day``."""
    if limit <= 0:
        return []
    return await typed_rows(conn, NearGist, NEAREST_GISTS, {
        "tenant": tenant, "conversations": conversations(conversation_ids), "vector": vector, "limit": limit,
        "start": first_day, "end": last_day})


@tracing.traced("retrieve facts", {"epistream.pathways": "entities"})
async def facts_named(conn: AsyncConnection, *, tenant: str, question: str, conversation_ids: list[str] | None,
                      limit: int, with_superseded: bool = True, first_day: date | None = None,
                      last_day: date | None = None) -> list[NamedFact]:
    """Facts about the entities the question names, newest said first, with ``current`` and the days
    they held, ``first_day`` / ``last_day`` (None: open)."""
    if limit <= 0:
        return []
    return await typed_rows(conn, NamedFact, FACTS_NAMED, {
        "tenant": tenant, "conversations": conversations(conversation_ids), "padded": padded_words(question),
        "limit": limit, "with_superseded": with_superseded, "start": first_day, "end": last_day})
