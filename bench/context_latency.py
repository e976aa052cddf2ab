"""Latency of the `context` read at LoCoMo size: the LoCoMo development split's turns stored in a
fresh database through the real ingest code, then its questions read in process through
epistream.consumers.context.build_context (question embedding, fused turn search, gists, facts, packing; no
model call), one after another, at each budget. Writes bench/results/context-latency.json.

    python -m bench.context_latency [--start-postgres] [--questions 300] [--budgets 250,1000,4000]

No enrichment runs (it needs a model), so the gist and fact reads run on empty tables: their
queries are timed, their rows are not. This is a benchmark: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg_pool import AsyncConnectionPool

from epistream.consumers.context import build_context
from epistream.consumers.retrieval import Recipes, from_settings
from epistream.db import create_pool, on_database
from epistream.embeddings import Embedder
from epistream.metrics import Metrics
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.segmenter import SegmenterConfig
from epistream.settings import Settings
from epistream.sources import load_locomo

from .report import write_results
from .scratch_db import scratch_database

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
DEFAULT_OUT = ROOT / "bench" / "results" / "context-latency.json"
TENANT = "locomo-context-bench"
WARM_UP = 10


@dataclass(frozen=True)
class Deps:
    pool: AsyncConnectionPool
    embedder: Embedder
    recipes: Recipes


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


async def _store(settings: Settings, embedder: Embedder, samples) -> int:  # type: ignore[no-untyped-def]
    pool = create_pool(settings)
    await pool.open(wait=True)
    stored = 0
    try:
        for sample in samples:
            records = [RawRecord("memory.turns", 0, i, None, t.to_bytes(), None) for i, t in enumerate(sample.turns)]
            for start in range(0, len(records), 256):
                await ingest_batch(records[start:start + 256], pool=pool, embedder=embedder, metrics=Metrics.create(),
                                   segmenter=SegmenterConfig())
            stored += len(records)
    finally:
        await pool.close()
    return stored


async def _measure(settings: Settings, embedder: Embedder, samples, questions: int,  # type: ignore[no-untyped-def]
                   budgets: list[int]) -> dict:
    asked = [(sample, qa) for sample in samples for qa in sample.qa]
    # Spread over every conversation, the same questions at every budget.
    chosen = [asked[i * len(asked) // questions] for i in range(min(questions, len(asked)))]
    pool = create_pool(settings)
    await pool.open(wait=True)
    deps = Deps(pool, embedder, from_settings(settings))
    results: dict[str, dict] = {}
    try:
        for budget in budgets:
            latencies, wall, embedding, items, used = [], [], [], [], []
            for n, (sample, qa) in enumerate(chosen[:WARM_UP] + chosen):
                # The embedding alone, for the breakdown: the read embeds the question itself (without names).
                started = time.perf_counter()
                await asyncio.to_thread(embedder.embed, [qa.question])
                embedded = time.perf_counter()
                context = await build_context(deps, tenant=TENANT, question=qa.question,
                                              asked_at=sample.turns[-1].ts, budget_tokens=budget,
                                              conversation_ids=[sample.conversation_id])
                if n < WARM_UP:
                    continue
                wall.append((time.perf_counter() - embedded) * 1000)
                embedding.append((embedded - started) * 1000)
                latencies.append(context.latency_ms)  # the whole read: speakers, embedding, searches, packing
                items.append(len(context.items))
                used.append(context.used_tokens)
            results[str(budget)] = {
                "questions": len(latencies),
                "latency_ms": {"p50": round(percentile(latencies, 0.50), 2), "p95": round(percentile(latencies, 0.95), 2),
                               "p99": round(percentile(latencies, 0.99), 2), "mean": round(statistics.mean(latencies), 2),
                               "max": round(max(latencies), 2)},
                "embedding_ms": {"p50": round(percentile(embedding, 0.50), 2),
                                 "p95": round(percentile(embedding, 0.95), 2)},
                "total_ms": {"p50": round(percentile(wall, 0.50), 2), "p95": round(percentile(wall, 0.95), 2)},
                "items_mean": round(statistics.mean(items), 1),
                "used_tokens_mean": round(statistics.mean(used), 1),
            }
            print(f"budget {budget}: {results[str(budget)]}")
    finally:
        await pool.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--budgets", default="250,1000,4000")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--start-postgres", action="store_true", help="start the embedded PostgreSQL first")
    args = parser.parse_args(argv)
    settings = Settings()
    with scratch_database(settings, "context_bench", start_postgres=args.start_postgres) as url:
        own = on_database(settings, url)
        samples = load_locomo(args.data, tenant=TENANT)
        embedder = Embedder.from_settings(own)
        started = time.perf_counter()
        stored = asyncio.run(_store(own, embedder, samples))
        print(f"stored {stored} turns of {len(samples)} conversations in {time.perf_counter() - started:.0f}s")
        # Reads are timed on settled tables: statistics current, no autovacuum racing the first budget.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        budgets = [int(b) for b in args.budgets.split(",")]
        results = asyncio.run(_measure(own, embedder, samples, args.questions, budgets))
    report = {"what": "context read latency, in process, one question at a time: latency_ms = the reply's"
                      " latency_ms (speaker lookup, the question's embedding, searches, packing), embedding_ms = the"
                      " question's embedding alone (for the breakdown), total_ms = the build_context call", "load_average": list(os.getloadavg()), "data": str(args.data),
              "turns": stored, "conversations": len(samples), "gists_and_facts": "none (no enrichment)",
              "by_budget": results}
    write_results(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
