"""Seed retrieval, the tools ``semantic_retrieve`` and ``lexical_retrieve``: gists or
turns by meaning or by words, within the question's conversations and an optional
inclusive range of days (the statements: consumers/retrieval/seeds.py)."""

from __future__ import annotations

from datetime import date

import numpy as np
from psycopg import AsyncConnection

from ..retrieval.execute import rows
from ..retrieval.fragments import conversations
from ..retrieval.seeds import LEXICAL_GISTS, LEXICAL_TURNS, SEMANTIC_GISTS, SEMANTIC_TURNS
from .limits import Operator, Target
from .results import GistHit, TurnHit


def _check_target(target: str) -> None:
    if target not in ("gists", "turns"):
        raise ValueError(f"target must be 'gists' or 'turns', not {target!r}")


async def semantic_retrieve(
    conn: AsyncConnection,
    *,
    tenant: str,
    vector: np.ndarray,
    conversation_ids: list[str] | None = None,
    target: Target = "gists",
    start: date | None = None,
    end: date | None = None,
    limit: int = 10,
) -> list[GistHit] | list[TurnHit]:
    """Nearest gists (time = the gist's dated period) or turns (time = the local day), by cosine."""
    _check_target(target)
    params = {"tenant": tenant, "vector": vector, "conversations": conversations(conversation_ids),
              "start": start, "end": end, "limit": limit}
    if target == "gists":
        return [GistHit.from_row(r) for r in await rows(conn, SEMANTIC_GISTS, params)]
    return [TurnHit.from_row(r) for r in await rows(conn, SEMANTIC_TURNS, params)]


async def lexical_retrieve(
    conn: AsyncConnection,
    *,
    tenant: str,
    query: str,
    conversation_ids: list[str] | None = None,
    target: Target = "gists",
    start: date | None = None,
    end: date | None = None,
    limit: int = 10,
    operator: Operator = "or",
) -> list[GistHit] | list[TurnHit]:
    """Full-text search ranked by ts_rank_cd: any word (or), all words (and), or the phrase."""
    _check_target(target)
    if operator not in ("or", "and", "phrase"):
        raise ValueError(f"operator must be 'or', 'and' or 'phrase', not {operator!r}")
    params = {"tenant": tenant, "query": query, "operator": operator,
              "conversations": conversations(conversation_ids), "start": start, "end": end, "limit": limit}
    if target == "gists":
        return [GistHit.from_row(r) for r in await rows(conn, LEXICAL_GISTS, params)]
    return [TurnHit.from_row(r) for r in await rows(conn, LEXICAL_TURNS, params)]
