"""The equal-budget eval's harness and its systems.

A *system* answers a question with ranked `Piece`s (a turn, or a gist/fact derived from turns), each
with the turn ids it carries, its text and its token cost. The harness cuts the ranking at a budget (the
longest prefix that fits) and counts the evidence turns present:

  verbatim recall      evidence turns whose own text is in the cut context (the primary figure)
  recall with sources  also the source turns of gists and facts in it (labelled as such)

Token cost is the product's estimate (epistream.pipeline.segmenter.estimate_tokens: ceil(characters / 4))
of a turn's ``speaker: text``, as issue 12 defines it.

The systems in process over the dataset's turns (``bm25``, MiniLM over the bare text ``dense_bare`` and
over ``[session date] speaker: text`` ``dense_dated``, their reciprocal-rank fusion; embeddings from the
project's embedder, computed once per run), and the systems that read the stored memory, in the cheapest
real way to store it: a database of the run's own on the PostgreSQL tier, the conversations written by
``epistream.pipeline.ingest.ingest_batch`` in process (turns, embeddings and segments exactly as the ingest
worker writes them, then each conversation's last segment closed by the idle-close record the worker
would send). No Kafka, no model: segments are not enriched, so no gists or facts exist.

  fused_turns   the project's fused turn search (BM25 full text + HNSW dense, RRF in SQL), fast mode's
                recipe with a pool deep enough to fill the largest budget
  dense_turns   the same SQL, dense pathway only (the eval's old dense top-k baseline)
  router        the deep-mode router (its time filter included): whole segments in fused order,
                their turns in the segment's order, so a cut ends the last segment turn by turn
  top_k_turns   the fused search's own top_k turns (retrieve_top_k: what fast mode read before it used
                the context builder; fast mode now reads the `context` system's text at its budget)
  deep_windows  what deep mode's assistants read (epistream.consumers.modes.deep.read_windows): windows
                around the best fused turns, as many as the budget holds, in the order of their best turn
  context       the `context` read itself (epistream.consumers.context.build_context) at each budget
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from epistream.consumers.context import build_context, ranked_memory
from epistream.consumers.modes.deep import read_windows, route_question
from epistream.consumers.retrieval import DENSE_TURNS, ContextRecipe, Recipes, search_turns
from epistream.consumers.timefilter import QuestionTime
from epistream.contracts.questions import Mode, Question
from epistream.contracts.turns import SegmentCloseRequest, Turn
from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder, turn_embedding_text
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import estimate_tokens
from epistream.pipeline.store.segments import config_from
from epistream.settings.processes import Settings
from epistream.storage.db import create_pool, on_database, tenant_scope
from epistream.testing.databases import drop_database, own_database, unique_name

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


# --- the systems in process: Okapi BM25 over short documents (no dependency), MiniLM, their fusion

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Function words that carry no topic: ranking on them only adds noise.
STOP_WORDS = frozenset("""
a an and are as at be been but by did do does for from had has have he her him his how i if in into is it its
me my of on or our she so than that the their them then there they this to was we were what when where which
who whom why will with would you your
""".split())


def words(text: str) -> list[str]:
    """Lower-case word tokens minus stop words."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


class BM25:
    """Okapi BM25 (k1, b) with the non-negative idf log(1 + (N - n + 0.5) / (n + 0.5))."""

    def __init__(self, documents: Sequence[str], *, k1: float = 1.5, b: float = 0.75) -> None:
        self._docs = [Counter(words(d)) for d in documents]
        self._lengths = [sum(c.values()) for c in self._docs]
        self._average = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        frequency: Counter[str] = Counter()
        for doc in self._docs:
            frequency.update(doc.keys())
        n = len(self._docs)
        self._idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in frequency.items()}
        self._k1, self._b = k1, b

    def scores(self, query: str) -> list[float]:
        terms = words(query)
        out = []
        for doc, length in zip(self._docs, self._lengths, strict=True):
            norm = self._k1 * (1 - self._b + self._b * length / self._average) if self._average else self._k1
            score = 0.0
            for term in terms:
                tf = doc.get(term)
                if tf:
                    score += self._idf[term] * tf * (self._k1 + 1) / (tf + norm)
            out.append(score)
        return out

RRF_K = 60


def bare_text(turn: Turn) -> str:
    """What memory.turns embedded before migration 011: the bare text."""
    return turn.text


def dated_text(turn: Turn) -> str:
    """What memory.turns embeds now (epistream.models.embeddings.turn_embedding_text):
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


# --- the systems over the stored memory -----------------------------------------------------------

# Turns each pathway of the fused search takes when it must fill 4,000 tokens (~25 tokens a turn).
DEEP_POOL = 200
# Segments the router ranks when it must fill 4,000 tokens (a LoCoMo segment is ~23 turns).
ROUTER_SEGMENTS = 40
INGEST_BATCH = 200


class CachedEmbedder:
    """The run's embeddings of the turn texts, looked up instead of computed again."""

    def __init__(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        self._by_text = dict(zip(texts, vectors, strict=True))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._by_text[t] for t in texts])


@dataclass
class Memory:
    """A run's own database, its pool and the tenant the conversations are stored under."""

    settings: Settings
    name: str
    pool: AsyncConnectionPool
    tenant: str

    @classmethod
    async def create(cls, settings: Settings, tenant: str) -> Memory:
        name = unique_name("budget")
        pool = create_pool(on_database(settings, own_database(settings, name)))
        await pool.open(wait=True)
        return cls(settings, name, pool, tenant)

    @classmethod
    async def attach(cls, settings: Settings, tenant: str) -> Memory:
        """A tenant already stored in the running stack's database (e.g. enriched by bench.locomo_eval --keep)."""
        pool = create_pool(settings)
        await pool.open(wait=True)
        return cls(settings, "", pool, tenant)

    async def drop(self) -> None:
        """Close the pool, and drop the database when it is the run's own (never the stack's)."""
        await self.pool.close()
        if self.name:
            drop_database(self.settings, self.name)

    async def store(self, turns: list[Turn], embedder: CachedEmbedder) -> int:
        """Every turn through the ingest worker's batch function, then an idle close per conversation."""
        records = [RawRecord("memory.turns", 0, n, t.conversation_id.encode(), t.to_bytes())
                   for n, t in enumerate(turns)]
        last: dict[str, str] = {}
        for t in turns:
            last[t.conversation_id] = t.turn_id
        closes = [SegmentCloseRequest(kind="segment_close", tenant=self.tenant, conversation_id=c, after_turn_id=t)
                  for c, t in last.items()]
        records += [RawRecord("memory.turns", 0, len(records) + n, c.conversation_id.encode(), c.to_bytes())
                    for n, c in enumerate(closes)]
        stored, metrics, segmenter = 0, Metrics.create(), config_from(self.settings)
        for start in range(0, len(records), INGEST_BATCH):
            result = await ingest_batch(records[start:start + INGEST_BATCH], pool=self.pool,
                                        embedder=embedder, metrics=metrics, segmenter=segmenter)  # type: ignore[arg-type]
            if result.dead:
                raise RuntimeError(f"ingest set aside {len(result.dead)} records: {result.dead[0].error}")
            stored += len(result.stored)
        return stored

    async def count(self, table: str) -> int:
        async with self.pool.connection() as conn, tenant_scope(conn, self.tenant):
            cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("memory", table)))
            row = await cur.fetchone()
        return int(row[0]) if row else 0


class StoredTurns:
    """A turn search over the stored memory: fused (``fused_turns``, ``top_k_turns``) or dense only."""

    budget_aware = False

    def __init__(self, name: str, memory: Memory, recipes: Recipes, *, dense_only: bool = False,
                 recipe_top_k: bool = False) -> None:
        self.name = name
        self._memory = memory
        if recipe_top_k:
            self._recipe = recipes.turns
        else:
            base = DENSE_TURNS if dense_only else recipes.turns
            self._recipe = replace(base, top_k=2 * DEEP_POOL, pool=max(DEEP_POOL, recipes.turns.pool))

    async def pieces(self, query: Query, budget: int) -> Sequence[Piece]:
        async with self._memory.pool.connection() as conn, tenant_scope(conn, self._memory.tenant):
            found = await search_turns(conn, tenant=self._memory.tenant, query=query.question, vector=query.vector,
                                       conversation_ids=[query.conversation_id], recipe=self._recipe)
        return [turn_piece(t.turn_id, t.speaker, t.text) for t in found]


class RouterSegments:
    """The deep-mode router's segments, whole, in fused order; each segment's turns as it lists them."""

    budget_aware = False

    name = "router"

    def __init__(self, memory: Memory, recipes: Recipes, turns: dict[tuple[str, str], Turn]) -> None:
        self._memory = memory
        self._recipes = replace(recipes, router=replace(recipes.router, top_k=ROUTER_SEGMENTS))
        self._turns = turns  # (conversation id, turn id) -> turn

    async def pieces(self, query: Query, budget: int) -> Sequence[Piece]:
        question = Question(question_id=f"q-{uuid.uuid4().hex[:8]}", tenant=self._memory.tenant,
                            question=query.question, conversation_ids=[query.conversation_id],
                            asked_at=query.asked_at)
        deps = _RouterDeps(self._memory.pool, self._recipes, Metrics.create())
        routed = await route_question(deps, question, query.vector)  # type: ignore[arg-type]  # what it reads of AnswerDeps
        out: list[Piece] = []
        for segment in routed:
            for turn_id in segment.turn_ids:
                turn = self._turns[(segment.conversation_id, turn_id)]
                out.append(turn_piece(turn.turn_id, turn.speaker, turn.text))
        return out


class MemoEmbedder:
    """The project's embedder, each distinct text embedded once per run (the context read embeds
    its question without the speakers' names, once per budget)."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self._known: dict[tuple[str, str], np.ndarray] = {}

    def embed(self, texts: Sequence[str], *, kind: Literal["passage", "query"] = "passage") -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if (kind, t) not in self._known]
        if missing:
            vectors = self._embedder.embed(missing, kind=kind)
            self._known.update(zip([(kind, t) for t in missing], vectors, strict=True))
        return np.stack([self._known[(kind, t)] for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text], kind="query")[0]


@dataclass(frozen=True)
class _RouterDeps:
    read_pool: AsyncConnectionPool
    recipes: Recipes
    metrics: Metrics


@dataclass(frozen=True)
class _WindowDeps:
    read_pool: AsyncConnectionPool
    embedder: MemoEmbedder
    recipes: Recipes
    metrics: Metrics


class DeepWindows:
    """Deep mode's reading windows at the budget (no cap on their number, so the budget is the only
    limit, as for every other system); each window's turns in time order."""

    budget_aware = True

    def __init__(self, memory: Memory, recipes: Recipes, embedder: MemoEmbedder, *, name: str = "deep_windows") -> None:
        self.name = name
        self._memory = memory
        self._recipes = recipes
        self._embedder = embedder

    async def pieces(self, query: Query, budget: int) -> Sequence[Piece]:
        windows = replace(self._recipes.windows, windows=10_000, budget_tokens=budget,
                          seeds=max(self._recipes.windows.seeds, budget // 10))
        deps = _WindowDeps(self._memory.pool, self._embedder, replace(self._recipes, windows=windows), Metrics.create())
        question = Question(question_id=f"q-{uuid.uuid4().hex[:8]}", tenant=self._memory.tenant,
                            question=query.question, conversation_ids=[query.conversation_id],
                            asked_at=query.asked_at, mode=Mode.DEEP)
        texts = await read_windows(deps, question)  # type: ignore[arg-type]
        return [turn_piece(t.turn_id, t.speaker, t.text) for text in texts for t in text.turns]


@dataclass(frozen=True)
class _ContextDeps:
    read_pool: AsyncConnectionPool
    embedder: MemoEmbedder
    recipes: Recipes


class ContextRead:
    """The product's `context` read (epistream.consumers.context.build_context), asked once per budget; each item
    costs what its line costs in the reply's text block (with its rank and date: stricter than
    ``speaker: text``)."""

    budget_aware = True

    def __init__(self, memory: Memory, recipes: Recipes, embedder: MemoEmbedder, *, name: str = "context",
                 read: ContextRecipe | None = None, explain_misses: bool = False) -> None:
        self.name = name
        self._memory = memory
        self._deps = _ContextDeps(memory.pool, embedder, recipes)
        self._read = read or recipes.context  # a variant of the read, else the recipes' own
        self.latencies_ms: dict[int, list[float]] = {}  # per budget: the read's own latency (its reply's latency_ms)
        self.explain_misses = explain_misses  # the scorer asks gathered_turns where evidence was missed

    def _question(self, query: Query, budget: int) -> Question:
        return Question(question_id=query.key, tenant=self._memory.tenant, question=query.question,
                        asked_at=query.asked_at, mode=Mode.CONTEXT, budget_tokens=budget,
                        conversation_ids=[query.conversation_id])

    async def pieces(self, query: Query, budget: int) -> Sequence[Piece]:
        context = await build_context(self._question(query, budget), self._deps, self._read)  # type: ignore[arg-type]
        self.latencies_ms.setdefault(budget, []).append(context.latency_ms)
        return [Piece(tuple(item.turn_ids), item.line, item.tokens, verbatim=item.kind == "turn")
                for item in context.items]

    async def gathered_turns(self, query: Query, budget: int) -> list[str]:
        """The ids of the turns the read gathered at ``budget``, in its order (each at its first place):
        what the pack took a prefix of. Not timed (a second read of the same question)."""
        question = self._question(query, budget)
        ranked = await ranked_memory(question, self._deps, self._read,  # type: ignore[arg-type]
                                     budget_tokens=budget, when=QuestionTime.of(question))
        return list(dict.fromkeys(t for c in ranked if c.kind == "turn" for t in c.turn_ids))


def where_missed(evidence: Sequence[str], pieces: Iterable[Piece], gathered: Sequence[str]) -> dict[str, object]:
    """Where the evidence a context missed sat in what its read gathered: each missed turn's place among
    the gathered turns (1-based; None: not gathered), and how many turns the context held verbatim."""
    present = {t for p in pieces if p.verbatim for t in p.turn_ids}
    place = {t: n for n, t in enumerate(gathered, start=1)}
    return {"turns_in_context": len(present),
            "missed": {t: place.get(t) for t in evidence if t not in present}}
