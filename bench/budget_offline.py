"""The in-process turn baselines of the equal-budget eval: BM25, MiniLM over the bare text,
MiniLM over ``[session date] speaker: text``, and reciprocal-rank fusion of BM25 with the latter.

Each ranks every turn of the question's conversation; the harness cuts the ranking at a budget.
Embeddings come from the project's embedder (ONNX MiniLM), computed once per run for all turns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from epistream.contracts import Turn
from epistream.embeddings import turn_embedding_text

from .bm25 import BM25
from .budget_context import Piece, Query, turn_line, turn_piece

RRF_K = 60


def bare_text(turn: Turn) -> str:
    """What memory.turns embedded before migration 011: the bare text."""
    return turn.text


def dated_text(turn: Turn) -> str:
    """What memory.turns embeds now (epistream.embeddings.turn_embedding_text):
    ``[1:56 pm on 8 May, 2023] Caroline: ...`` (this wording reads 0.02-0.03 higher at every budget than
    ``[08 May 2023]``, and reproduces the issue's table more closely)."""
    return turn_embedding_text(turn.speaker, turn.text, turn.ts)


class DiskCachedEmbed:
    """The embedder's vectors for a list of texts, kept in ``folder`` under a hash of the texts and
    the model file: a rerun of the eval on the same data does not embed again (minutes on 2 cores)."""

    def __init__(self, embed: Callable[[list[str]], np.ndarray], folder: Path, model_key: str) -> None:
        self._embed, self._folder, self._model_key = embed, folder, model_key

    def __call__(self, texts: list[str]) -> np.ndarray:
        digest = hashlib.sha256("\x00".join([self._model_key, *texts]).encode()).hexdigest()[:24]
        path = self._folder / f"budget-embeddings-{digest}.npy"
        if path.exists():
            return np.load(path)
        vectors = self._embed(texts)
        self._folder.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors)
        return vectors


@dataclass
class Conversation:
    """One conversation's turns and what the offline systems rank them with."""

    turns: list[Turn]
    pieces: list[Piece]
    bm25: BM25
    bare: np.ndarray  # (turns, 384) unit vectors
    dated: np.ndarray


def build_conversations(samples_turns: dict[str, list[Turn]], embed: Callable[[list[str]], np.ndarray]
                        ) -> dict[str, Conversation]:
    """Per conversation id: BM25 over ``speaker: text`` and both embeddings (one embed call each)."""
    every = [t for turns in samples_turns.values() for t in turns]
    bare = embed([bare_text(t) for t in every])
    dated = embed([dated_text(t) for t in every])
    out: dict[str, Conversation] = {}
    start = 0
    for conversation_id, turns in samples_turns.items():
        end = start + len(turns)
        out[conversation_id] = Conversation(
            turns=turns, pieces=[turn_piece(t.turn_id, t.speaker, t.text) for t in turns],
            bm25=BM25([turn_line(t.speaker, t.text) for t in turns]), bare=bare[start:end], dated=dated[start:end])
        start = end
    return out


def order_by(scores: Sequence[float] | np.ndarray) -> list[int]:
    """Indexes by descending score; ties keep conversation order (stable)."""
    return sorted(range(len(scores)), key=lambda i: -float(scores[i]))


def rrf(*rankings: list[int], k: int = RRF_K) -> list[int]:
    """Reciprocal-rank fusion of full rankings of the same items (rank 1 = best)."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, index in enumerate(ranking, start=1):
            fused[index] = fused.get(index, 0.0) + 1.0 / (k + rank)
    return sorted(fused, key=lambda i: -fused[i])


class OfflineTurns:
    """One of the four offline rankings over a conversation's turns."""

    budget_aware = False

    def __init__(self, name: str, conversations: dict[str, Conversation]) -> None:
        if name not in OFFLINE_RANKINGS:
            raise ValueError(f"unknown offline system {name!r}: choose from {sorted(OFFLINE_RANKINGS)}")
        self.name = name
        self._conversations = conversations
        self._rank = OFFLINE_RANKINGS[name]

    async def pieces(self, query: Query, budget: int) -> Sequence[Piece]:
        conversation = self._conversations[query.conversation_id]
        return [conversation.pieces[i] for i in self._rank(conversation, query)]


def _bm25(c: Conversation, q: Query) -> list[int]:
    return order_by(c.bm25.scores(q.question))


def _dense_bare(c: Conversation, q: Query) -> list[int]:
    return order_by(c.bare @ q.vector)


def _dense_dated(c: Conversation, q: Query) -> list[int]:
    return order_by(c.dated @ q.vector)


def _rrf(c: Conversation, q: Query) -> list[int]:
    return rrf(_bm25(c, q), _dense_dated(c, q))


OFFLINE_RANKINGS: dict[str, Callable[[Conversation, Query], list[int]]] = {
    "bm25": _bm25, "dense_bare": _dense_bare, "dense_dated": _dense_dated, "rrf_bm25_dense_dated": _rrf,
}
