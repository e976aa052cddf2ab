"""The fused turn search as a question asks it: the speakers it names looked up (retrieval/speakers.py),
their names taken out of the text that is searched and embedded, their turns given the recipe's bonus.
The context read and deep mode's reading windows both start from these turns."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from epistream.core import tracing
from epistream.models.embeddings import Embedder

from .retrieval import RetrievedTurn, TurnRecipe, search_turns
from .retrieval.speakers import named_speakers, without_names


class SearchDeps(Protocol):
    @property
    def read_pool(self) -> AsyncConnectionPool: ...  # a standby's, or the primary's (AnswerDeps.read_pool)
    @property
    def embedder(self) -> Embedder: ...


@dataclass(frozen=True)
class FoundTurns:
    turns: list[RetrievedTurn]
    vector: np.ndarray  # the searched text's embedding (gists are read by it too)
    speakers: list[str]  # the speakers the question names, case-folded
    search_text: str  # the question without their names


@tracing.traced("retrieve turns", {"epistream.pathways": "dense,lexical"})
async def best_turns(conn: AsyncConnection, embedder: Embedder, *, tenant: str, question: str,
                     conversation_ids: list[str] | None, recipe: TurnRecipe, start: datetime | None = None,
                     end: datetime | None = None) -> FoundTurns:
    """The recipe's best turns for ``question`` said within [start, end), best first. Run inside
    ``tenant_scope(conn, tenant)``; the connection is held while the question is embedded (a few
    milliseconds), which costs less than a second checkout and tenant scope."""
    speakers: list[str] = []
    if recipe.speaker_bonus > 0:  # a zero bonus turns speaker matching off (the ablation)
        speakers = await named_speakers(conn, tenant=tenant, question=question, conversation_ids=conversation_ids)
    # The name is in every one of the speaker's turns: searched for, it only adds noise (the bonus stands for it).
    search_text = without_names(question, speakers)
    vector = await asyncio.to_thread(embedder.embed_query, search_text)
    turns = await search_turns(conn, tenant=tenant, query=search_text, vector=vector,
                               conversation_ids=conversation_ids, recipe=recipe, start=start, end=end,
                               speakers=speakers)
    return FoundTurns(turns, vector, speakers, search_text)


@tracing.traced("retrieve turns", {"epistream.pathways": "dense,lexical", "epistream.within_period": 1})
async def best_turns_within(conn: AsyncConnection, found: FoundTurns, *, tenant: str,
                            conversation_ids: list[str] | None, recipe: TurnRecipe, start: datetime | None,
                            end: datetime | None) -> list[RetrievedTurn]:
    """The same search as ``found``'s (its text, vector and speakers: nothing embedded again), within
    [start, end): the turns about a question's period, which may rank too low in the whole memory."""
    return await search_turns(conn, tenant=tenant, query=found.search_text, vector=found.vector,
                              conversation_ids=conversation_ids, recipe=recipe, start=start, end=end,
                              speakers=found.speakers)
