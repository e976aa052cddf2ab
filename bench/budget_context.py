"""Evidence recall at equal token budgets: what a system puts in the context, and how it is scored.

A *system* answers a question with ranked `Piece`s (a turn, or a gist/fact derived from turns),
each with the turn ids it carries, its text and its token cost. The harness cuts the ranking at
a budget (the longest prefix that fits) and counts the evidence turns present:

  verbatim recall      evidence turns whose own text is in the cut context (the primary figure)
  recall with sources  also the source turns of gists and facts in it (labelled as such)

Token cost is the product's estimate (epistream.pipeline.segmenter.estimate_tokens: ceil(characters / 4))
of a turn's ``speaker: text``, as issue 12 defines it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np

from epistream.pipeline.segmenter import estimate_tokens

BUDGETS = (250, 500, 1000, 2000, 4000)


def turn_line(speaker: str, text: str) -> str:
    """A turn as a context shows it, and as its token cost is counted."""
    return f"{speaker}: {text}"


def turn_tokens(speaker: str, text: str) -> int:
    return estimate_tokens(turn_line(speaker, text))


@dataclass(frozen=True)
class Piece:
    """One ranked item of a context. ``verbatim``: the turns' own text (a turn); else derived
    from ``turn_ids`` (a gist or a fact), whose own text is not in the context."""

    turn_ids: tuple[str, ...]
    text: str
    tokens: int
    verbatim: bool = True


def turn_piece(turn_id: str, speaker: str, text: str) -> Piece:
    return Piece((turn_id,), turn_line(speaker, text), turn_tokens(speaker, text))


@dataclass(frozen=True)
class Query:
    """One LoCoMo question with evidence, as every system sees it."""

    key: str  # unique within a run: sample id and question number
    sample_id: str
    conversation_id: str
    question: str
    category: int
    evidence: tuple[str, ...]
    asked_at: datetime
    vector: np.ndarray  # the question's MiniLM embedding (the project's embedder)


class System(Protocol):
    """What a retrieval system gives the harness. ``budget_aware`` systems (a context builder
    that fits its own budget) are asked once per budget; the others once, at the largest budget,
    their ranking then cut at each."""

    name: str
    budget_aware: bool

    async def pieces(self, query: Query, budget: int) -> Sequence[Piece]: ...


def cut(pieces: Iterable[Piece], budget: int) -> list[Piece]:
    """The longest prefix of the ranking within ``budget`` tokens. A turn already in the context
    costs nothing again (overlapping segments, a gist beside its turn)."""
    kept: list[Piece] = []
    seen: set[tuple[tuple[str, ...], bool]] = set()
    used = 0
    for piece in pieces:
        key = (piece.turn_ids, piece.verbatim)
        if key in seen:
            continue
        if used + piece.tokens > budget:
            break
        kept.append(piece)
        seen.add(key)
        used += piece.tokens
    return kept


def context_tokens(pieces: Iterable[Piece]) -> int:
    return sum(p.tokens for p in pieces)


def verbatim_recall(evidence: Sequence[str], pieces: Iterable[Piece]) -> float | None:
    """Share of evidence turns whose own text is in the context (None without evidence)."""
    wanted = set(evidence)
    if not wanted:
        return None
    present = {t for p in pieces if p.verbatim for t in p.turn_ids}
    return len(wanted & present) / len(wanted)


def recall_with_sources(evidence: Sequence[str], pieces: Iterable[Piece]) -> float | None:
    """Like verbatim_recall, also crediting the source turns of gists and facts in the context."""
    wanted = set(evidence)
    if not wanted:
        return None
    present = {t for p in pieces for t in p.turn_ids}
    return len(wanted & present) / len(wanted)
