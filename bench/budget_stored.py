"""The systems of the equal-budget eval that read the stored memory, and the cheapest real way
to store it: a database of the run's own on the PostgreSQL tier, the conversations written by
``epistream.pipeline.ingest.ingest_batch`` in process (turns, embeddings and segments exactly as the ingest
worker writes them, then each conversation's last segment closed by the idle-close record the worker
would send). No Kafka, no model: segments are not enriched, so no gists or facts exist.

  fused_turns   the project's fused turn search (BM25-like full text + HNSW dense, RRF in SQL),
                fast mode's recipe with a pool deep enough to fill the largest budget
  dense_turns   the same SQL, dense pathway only (the eval's old dense top-k baseline)
  router        the deep-mode router (its time filter included): whole segments in fused order,
                their turns in the segment's order, so a cut ends the last segment turn by turn
  top_k_turns   the fused search's own top_k turns (retrieve_top_k: what fast mode read before it used
                the context builder; fast mode now reads the `context` system's text at its budget)
  deep_windows  what deep mode's assistants read (epistream.consumers.modes.deep.read_windows): windows around
                the best fused turns, as many as the budget holds, in the order of their best turn
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from epistream.consumers.context import NEIGHBOURS, Neighbours, build_context
from epistream.consumers.modes.deep import read_windows, window_for
from epistream.consumers.retrieval import DENSE_TURNS, Recipes, search_turns
from epistream.consumers.router import route
from epistream.contracts import Mode, Question, SegmentCloseRequest, Turn
from epistream.db import admin_database_url, apply_migrations, create_pool, on_database, tenant_scope
from epistream.embeddings import Embedder
from epistream.metrics import Metrics
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.store.segments import config_from
from epistream.settings import Settings

from .budget_context import Piece, Query, turn_piece

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
        name = f"budget_{uuid.uuid4().hex[:8]}"
        base = admin_database_url(settings)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = make_conninfo(base, dbname=name)
        apply_migrations(url)
        pool = create_pool(on_database(settings, url))
        await pool.open(wait=True)
        return cls(settings, name, pool, tenant)

    async def drop(self) -> None:
        await self.pool.close()
        with psycopg.connect(admin_database_url(self.settings), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))

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
        self._recipe = replace(recipes.router, top_k=ROUTER_SEGMENTS)
        self._turns = turns  # (conversation id, turn id) -> turn

    async def pieces(self, query: Query, budget: int) -> Sequence[Piece]:
        question = Question(question_id=f"q-{uuid.uuid4().hex[:8]}", tenant=self._memory.tenant,
                            question=query.question, conversation_ids=[query.conversation_id],
                            asked_at=query.asked_at)
        window = window_for(question)  # deep mode's time filter, and its fallback when it empties the result
        async with self._memory.pool.connection() as conn, tenant_scope(conn, self._memory.tenant):
            routed = await route(conn, tenant=self._memory.tenant, question=query.question, vector=query.vector,
                                 conversation_ids=[query.conversation_id], recipe=self._recipe, window=window)
            if not routed and window is not None:
                routed = await route(conn, tenant=self._memory.tenant, question=query.question,
                                     vector=query.vector, conversation_ids=[query.conversation_id],
                                     recipe=self._recipe)
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
        self._known: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._known]
        if missing:
            self._known.update(zip(missing, self._embedder.embed(missing), strict=True))
        return np.stack([self._known[t] for t in texts])


@dataclass(frozen=True)
class _WindowDeps:
    pool: AsyncConnectionPool
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
    pool: AsyncConnectionPool
    embedder: MemoEmbedder
    recipes: Recipes


class ContextRead:
    """The product's `context` read (epistream.consumers.context.build_context), asked once per budget; each item
    costs what its line costs in the reply's text block (with its rank and date: stricter than
    ``speaker: text``)."""

    budget_aware = True

    def __init__(self, memory: Memory, recipes: Recipes, embedder: MemoEmbedder, *, name: str = "context",
                 neighbours: Neighbours = NEIGHBOURS) -> None:
        self.name = name
        self._memory = memory
        self._deps = _ContextDeps(memory.pool, embedder, recipes)
        self._neighbours = neighbours

    async def pieces(self, query: Query, budget: int) -> Sequence[Piece]:
        context = await build_context(self._deps, tenant=self._memory.tenant, question=query.question,  # type: ignore[arg-type]
                                      asked_at=query.asked_at, budget_tokens=budget,
                                      conversation_ids=[query.conversation_id], neighbours=self._neighbours)
        return [Piece(tuple(item.turn_ids), item.line, item.tokens, verbatim=item.kind == "turn")
                for item in context.items]
