"""python -m bench.scale [--sizes 10000,100000,1000000] [--start-postgres]: grow one memory of the
1M-turn workload through each size and measure it there; writes bench/results/scale.json and .png.

The vectors must be computed first (hours for 1M on two cores, resumable):
    nice python -m bench.scale.vectors --size 1m
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
from dataclasses import replace
from pathlib import Path

import psycopg

from epistream.consumers.retrieval import from_settings
from epistream.models.embeddings import Embedder
from epistream.settings.processes import Settings
from epistream.storage.db import create_pool, database_url, on_database
from epistream.testing.databases import scratch_database

from ..report import write_results
from ..stack import up
from ..workload_scale import PRESETS, WorkloadSpec, conversation_questions
from .disk import disk_usage, postgres_settings
from .load import grow, grow_bulk, prepare
from .plot import plot, project
from .reads import Case, Deps, exact_pool, measure_case
from .vectors import CHUNK, DEFAULT_DIR, VectorStore

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench" / "results" / "scale.json"


def cases(spec: WorkloadSpec, questions: int) -> list[Case]:
    busy = spec.busy_tenant
    asked = [q.question for index in range(spec.conversations_per_tenant)
             for q in conversation_questions(spec, index)]
    # Spread over the tenant's conversations, the same questions at every size.
    tenant_questions = [asked[i * len(asked) // questions] for i in range(min(questions, len(asked)))]
    long_tenant, long_id = spec.long_conversation  # type: ignore[misc]
    long_questions = [q.question for q in conversation_questions(spec, spec.conversations - 1, limit=questions)]
    return [Case("many_conversations", busy, None, tenant_questions),  # type: ignore[arg-type]
            Case("one_large_conversation", long_tenant, [long_id], long_questions)]


async def read_all(settings: Settings, url: str, embedder: Embedder, chosen: list[Case], *, asked_at, budget: int,
                   recall_questions: int) -> dict:
    """Per case: the default read, timed, with its recall against the exact read; and, timed beside it,
    the same read without the lexical match cap (what every word finding its turns costs)."""
    indexed_pool, exact = create_pool(settings, url=url), exact_pool(settings, url)
    await indexed_pool.open(wait=True)
    await exact.open(wait=True)
    recipes = from_settings(settings)
    uncapped = replace(recipes, turns=replace(recipes.turns, match_cap=0))
    try:
        reads = {}
        for case in chosen:
            # Exact: no index scan (HNSW) and every word of the question finding turns (no match cap).
            reads[case.name] = await measure_case(Deps(indexed_pool, embedder, recipes), Deps(exact, embedder, uncapped),
                                                  case, asked_at=asked_at, budget=budget,
                                                  recall_questions=recall_questions)
            reads[case.name]["uncapped_lexical"] = await measure_case(
                Deps(indexed_pool, embedder, uncapped), Deps(exact, embedder, uncapped), case, asked_at=asked_at,
                budget=budget, recall_questions=recall_questions)
        return reads
    finally:
        await indexed_pool.close()
        await exact.close()


def tenant_turns(conn: psycopg.Connection, case: Case) -> int:
    if case.conversation_ids:
        query = "SELECT count(*) FROM memory.turns WHERE tenant = %s AND conversation_id = ANY(%s)"
        return conn.execute(query, (case.tenant, case.conversation_ids)).fetchone()[0]  # type: ignore[index]
    return conn.execute("SELECT count(*) FROM memory.turns WHERE tenant = %s", (case.tenant,)).fetchone()[0]  # type: ignore[index]


def run(args: argparse.Namespace, settings: Settings, url: str) -> dict:
    spec = PRESETS["1m"]
    store = VectorStore(args.vectors / settings.embedding_model / "1m", spec)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if not store.ready(sizes[-1]):
        missing = sum(not store.have(i) for i in range(-(-sizes[-1] // CHUNK)))
        raise SystemExit(f"{missing} vector chunks of the first {sizes[-1]} turns are missing: "
                         "run `nice python -m bench.scale.vectors --size 1m` first")
    own = on_database(settings, url)
    embedder = Embedder.from_settings(own)
    chosen = cases(spec, args.questions)
    chunks = store.chunked()
    points = []
    loaded = 0
    with psycopg.connect(url, autocommit=True) as conn:
        prepare(conn, embedder.name)
        for size in sizes:
            step = list(itertools.islice(chunks, (size - loaded) // CHUNK))
            bulk = None
            if args.bulk_above and size > args.bulk_above and len(step) > 1:
                bulk = grow_bulk(conn, step, maintenance_work_mem=args.maintenance_work_mem)
                figures = bulk.tail
            else:
                figures = grow(conn, step)
            loaded = size
            last_ts = conn.execute("SELECT max(ts) FROM memory.turns").fetchone()[0]  # type: ignore[index]
            conn.execute("VACUUM ANALYZE memory.turns")  # reads are timed on settled tables
            # ... and not beside the write-back of what was just loaded (at 1M, gigabytes of dirty pages).
            conn.execute("CHECKPOINT")
            reads = asyncio.run(read_all(own, database_url(own), embedder, chosen, asked_at=last_ts, budget=args.budget,
                                         recall_questions=args.recall_questions))
            for case in chosen:
                reads[case.name]["case_turns"] = tenant_turns(conn, case)
            point = {"turns": size, "load": {"rows": figures.rows, "seconds": round(figures.seconds, 2),
                                             "rows_per_s": round(figures.rows_per_s, 1),
                                             "unindexed_rows_per_s": round(figures.probe_rows_per_s, 1),
                                             "index_ms_per_row": round(figures.index_ms_per_row, 3)},
                     "disk": disk_usage(conn, size), "reads": reads, "load_average": list(os.getloadavg())}
            if bulk is not None:
                point["load"]["bulk"] = bulk.as_dict()
            print(json.dumps(point), flush=True)
            points.append(point)
        pg = postgres_settings(conn)
    return {"what": "one memory of the bench.workload_scale 1M workload, grown by COPY through each size; the "
                    "context read (in process, no model) timed there for a tenant of many conversations (whole "
                    "tenant) and one large conversation; recall_vs_exact = share of an exact (no index scan) "
                    "read's turns the indexed read also returned",
            "budget_tokens": args.budget, "workload": {"tenants": spec.tenants + 1, "conversations": spec.conversations,
                                                       "turns": spec.turns},
            "postgres_settings": pg, "points": points}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="turn counts, multiples of 10,000")
    # 200: a p95 over 60 reads was its third-slowest read, which moved by 10 ms from run to run at 1M.
    parser.add_argument("--questions", type=int, default=200, help="per case, timed at every size")
    parser.add_argument("--recall-questions", type=int, default=30, help="of those, also read exactly")
    parser.add_argument("--budget", type=int, default=1000)
    parser.add_argument("--vectors", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--start-postgres", action="store_true", help="start the embedded PostgreSQL first")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    parser.add_argument("--bulk-above", type=int, default=0,
                        help="grow to sizes above this as a restore would: HNSW dropped, rows copied, index built "
                             "once, the last 10,000 rows copied with every index (0: never)")
    parser.add_argument("--maintenance-work-mem", default="2GB", help="for the HNSW build of a bulk step")
    args = parser.parse_args(argv)
    if any(int(s) % CHUNK for s in args.sizes.split(",")):
        parser.error(f"sizes are multiples of {CHUNK}")
    settings = Settings()
    if args.start_postgres:
        up(settings, only={"postgres"})
    with scratch_database(settings, "scale_bench", keep=args.keep) as url:
        report = run(args, settings, url)
    if len(report["points"]) > 1:
        report["projection"] = project(report, 10 * report["points"][-1]["turns"])
    write_results(args.out, report, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
