"""The context read at one size: latency, and how many of its turns an exact search would also give.

Each case asks its questions one after another through epistream.consumers.context.build_context, in process
(question embedding, speaker lookup, fused BM25 + HNSW turn search, gists, facts, packing; no model).
The same questions are then read through a pool whose sessions cannot use an index scan
(``enable_indexscan = off``) with no match cap on the lexical pathway: HNSW serves only index scans,
so there the dense pathway is an exact scan, and every word of the question finds its turns (full
text still uses its GIN index by bitmap). Recall = the share of the exact read's turns that the
indexed read returned too, at the same budget.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from epistream.consumers.context import build_context
from epistream.consumers.retrieval import Recipes
from epistream.contracts.questions import Mode, Question
from epistream.models.embeddings import Embedder
from epistream.settings.processes import Settings
from epistream.storage.db import create_pool

WARM_UP = 5


@dataclass(frozen=True)
class Deps:
    """What build_context reads with: a pool, the embedder, the recipes."""

    read_pool: AsyncConnectionPool
    embedder: Embedder
    recipes: Recipes


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


@dataclass(frozen=True)
class Case:
    """Questions of one tenant, read across all its conversations or within the given ones."""

    name: str
    tenant: str
    conversation_ids: list[str] | None
    questions: Sequence[str]


def exact_pool(settings: Settings, url: str) -> AsyncConnectionPool:
    return create_pool(settings, url=make_conninfo(url, options="-c enable_indexscan=off"))


async def _read(deps: Deps, case: Case, question: str, asked_at: datetime, budget: int):  # type: ignore[no-untyped-def]
    asked = Question(question_id="in-process", tenant=case.tenant, question=question, asked_at=asked_at,
                     mode=Mode.CONTEXT, budget_tokens=budget, conversation_ids=case.conversation_ids)
    return await build_context(asked, deps, deps.recipes.context)


def _turn_ids(context) -> set[str]:  # type: ignore[no-untyped-def]
    return {f"{i.conversation_id}/{i.turn_id}" for i in context.items if i.kind == "turn"}


async def measure_case(indexed: Deps, exact: Deps, case: Case, *, asked_at: datetime, budget: int,
                       recall_questions: int) -> dict:
    latencies: list[float] = []
    found: dict[str, set[str]] = {}
    for n, question in enumerate([*case.questions[:WARM_UP], *case.questions]):
        context = await _read(indexed, case, question, asked_at, budget)
        if n >= WARM_UP:
            latencies.append(context.latency_ms)
            found.setdefault(question, _turn_ids(context))
    recalls = []
    for question in list(found)[:recall_questions]:
        truth = _turn_ids(await _read(exact, case, question, asked_at, budget))
        if truth:
            recalls.append(len(truth & found[question]) / len(truth))
    return {
        "questions": len(latencies),
        "p50_ms": round(percentile(latencies, 0.50), 2),
        "p95_ms": round(percentile(latencies, 0.95), 2),
        "max_ms": round(max(latencies), 2),
        "recall_vs_exact": round(statistics.mean(recalls), 4) if recalls else None,
        "recall_questions": len(recalls),
    }
