"""``python -m bench.run [--quick | --turns N] [--keep]``: the ingest benchmark.

Starts the embedded stack if needed (and leaves it running), then measures on
the same texts: end-to-end ingest, the embedding model alone, and a plain COPY.
Writes bench/results/ingest.{json,png} and prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from epistream.contracts import Turn
from epistream.db import database_url
from epistream.settings import Settings
from infra import services

from . import report
from .baselines import Timed, measure_copy, measure_embedding
from .ingest import IngestFigures, WarmUp, delete_tenant, measure_ingest, warm_up
from .stack import stale_worker_sources
from .workload import Workload, load_workload

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
QUICK_TURNS = 300
WARMUP_TURNS = 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Benchmark the ingest path against the embedding model alone and a plain COPY.",
    )
    p.add_argument("--turns", type=int, help="cap the number of turns (default: the whole LoCoMo dev split)")
    p.add_argument("--quick", action="store_true", help=f"a small run of {QUICK_TURNS} turns")
    p.add_argument("--keep", action="store_true", help="keep the benchmark's rows in memory.turns")
    p.add_argument("--no-logged-copy", action="store_true", help="skip the COPY into a logged scratch table")
    p.add_argument("--results", type=Path, default=RESULTS, help="where ingest.json and ingest.png go")
    return p.parse_args(argv)


def _warmup_turns(workload: Workload, run_id: str) -> list[Turn]:
    tenant = f"bench-{run_id}-warmup"
    # A tenant of its own: the warm-up's rows must not count towards the measured run.
    return [
        t.model_copy(update={"tenant": tenant, "conversation_id": f"{tenant}-{i % 4}"})
        for i, t in enumerate(workload.turns[:WARMUP_TURNS])
    ]


def _breakdown(ingest: IngestFigures) -> dict[str, Any] | None:
    w = ingest.worker
    if w is None or w.batches <= 0:
        return None
    return {
        "batches": int(w.batches),
        "mean_batch_turns": round(w.turns / w.batches, 1),
        "embed_s": round(w.embed_seconds, 3),
        "store_s": round(w.batch_seconds - w.embed_seconds, 3),  # upsert + commit (+ decode, negligible)
        "outside_batches_s": round(ingest.wall_s - w.batch_seconds, 3),  # Kafka fetch, Faust, batch wait, poll lag
        "worker_embed_sentences_per_s": round(w.turns / w.embed_seconds, 1) if w.embed_seconds else None,
    }


def _per_cpu_second(ingest: IngestFigures, embed: Timed) -> dict[str, float] | None:
    if not ingest.worker_cpu_s or not embed.cpu_s:
        return None
    worker = ingest.turns / ingest.worker_cpu_s
    model = embed.count / embed.cpu_s
    return {
        "ingest_worker_turns": round(worker, 2),
        "embedding_sentences": round(model, 2),
        "ingest_over_embedding": round(worker / model, 4),
    }


def build_result(
    workload: Workload,
    settings: Settings,
    ingest: IngestFigures,
    embed: Timed,
    copy: Timed,
    copy_logged: Timed | None,
    warmup: WarmUp,
) -> dict[str, Any]:
    throughput = {
        "ingest_turns_per_s": round(ingest.turns_per_s, 2),
        "embedding_sentences_per_s": round(embed.per_s, 2),
        "copy_rows_per_s": round(copy.per_s, 1),
        "copy_logged_rows_per_s": round(copy_logged.per_s, 1) if copy_logged else None,
    }
    return {
        "workload": workload.source,
        "turns": ingest.turns,
        "tenant": workload.tenant,
        "embedding_batch": settings.embedding_batch,
        "ingest_batch": settings.ingest_batch,
        "throughput": throughput,
        "ratios": {
            "ingest_over_embedding": round(ingest.turns_per_s / embed.per_s, 4),
            "ingest_over_copy": round(ingest.turns_per_s / copy.per_s, 5),
            "embedding_over_copy": round(embed.per_s / copy.per_s, 5),
            "ingest_over_copy_logged": round(ingest.turns_per_s / copy_logged.per_s, 5) if copy_logged else None,
        },
        "latency_s": {
            "p50": round(ingest.latency_p50_s, 3),
            "p95": round(ingest.latency_p95_s, 3),
            "max": round(ingest.latency_max_s, 3),
            "unloaded_p50": round(warmup.latency_p50_s, 3),
            "unloaded_max": round(warmup.latency_max_s, 3),
            "note": "stored_at - produced_at; stored_at is the insert transaction's start, so a lower bound. "
            "p50/p95/max: all turns produced at once, so mostly queueing; unloaded: the warm-up's turns, "
            "sent one by one to an idle worker",
        },
        "seconds": {
            "warmup": round(warmup.seconds, 2),
            "produce": round(ingest.produce_s, 3),
            "ingest_wall": round(ingest.wall_s, 3),
            "ingest_db_span": round(ingest.db_span_s, 3),
            "embedding": round(embed.seconds, 3),
            "copy": round(copy.seconds, 3),
            "copy_logged": round(copy_logged.seconds, 3) if copy_logged else None,
        },
        "worker_breakdown": _breakdown(ingest),
        # Per CPU-second of the process doing the work: unlike the rates above, barely moved by
        # neighbours taking cores (the ingest worker's figure leaves out PostgreSQL's and Kafka's CPU).
        "per_cpu_second": _per_cpu_second(ingest, embed),
        # Cores each CPU-bound phase actually got; well below nproc means a neighbour took the rest.
        "cores_used": {
            "ingest_worker": round(ingest.worker_cpu_s / ingest.wall_s, 2) if ingest.worker_cpu_s else None,
            "embedding": round(embed.cpu_s / embed.seconds, 2) if embed.cpu_s else None,
        },
        "machine": report.machine_info(ROOT),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.turns is not None and args.turns < 1:
        sys.exit("--turns must be at least 1")
    settings = Settings()
    if settings.state_dir == (ROOT / ".epistream-test").resolve():
        sys.exit("EPISTREAM_HOME points at the test suite's stack; unset it (the benchmark uses .epistream)")
    limit = args.turns if args.turns is not None else (QUICK_TURNS if args.quick else None)
    run_id = f"{datetime.now(UTC):%Y%m%dt%H%M%S}-{uuid.uuid4().hex[:6]}"

    print(f"starting the stack under {settings.state_dir} (idempotent)")
    for row in services.up(settings):
        print(f"  up   {row.name:<15} {row.detail}")
    url = database_url(settings)
    worker_started, stale = stale_worker_sources(settings, ROOT)
    if stale:
        shown = ", ".join(stale[:4]) + (f" and {len(stale) - 4} more" if len(stale) > 4 else "")
        print(f"  note: the ingest worker (started {worker_started:%H:%M:%S}) predates changes to {shown};")
        print("        `epistream down && epistream up` restarts it on the current code")
    workload = load_workload(ROOT, run_id=run_id, limit=limit)
    warmup = _warmup_turns(workload, run_id)
    print(f"\nworkload: {len(workload.turns)} {workload.source} turns, tenant {workload.tenant}")
    try:
        print(f"warm-up: {len(warmup)} turns through the worker")
        warmed = warm_up(settings, url, warmup)
        print(f"  done in {warmed.seconds:.1f}s, latency p50 {warmed.latency_p50_s:.2f}s")
        print("1/3 ingest end to end")
        ingest = measure_ingest(settings, url, workload.turns)
        print(f"  {ingest.turns_per_s:.1f} turns/s ({ingest.wall_s:.1f}s)")
        # After the ingest run: the embedder would otherwise fight the worker for the cores.
        print("2/3 embedding model alone")
        embed, vectors = measure_embedding(settings, workload.texts)
        print(f"  {embed.per_s:.1f} sentences/s ({embed.seconds:.1f}s)")
        print("3/3 plain COPY")
        copy = measure_copy(url, workload.turns, vectors, temporary=True, run_id=run_id)
        print(f"  temp table: {copy.per_s:.0f} rows/s ({copy.seconds:.2f}s)")
        copy_logged = None
        if not args.no_logged_copy:
            copy_logged = measure_copy(url, workload.turns, vectors, temporary=False, run_id=run_id)
            print(f"  logged table: {copy_logged.per_s:.0f} rows/s ({copy_logged.seconds:.2f}s)")
    finally:
        if not args.keep:
            removed = sum(delete_tenant(url, t) for t in (workload.tenant, warmup[0].tenant))
            print(f"removed the benchmark's {removed} rows from memory.turns")

    result = build_result(workload, settings, ingest, embed, copy, copy_logged, warmed)
    result["worker"] = {
        "started_at": worker_started.isoformat(timespec="seconds") if worker_started else None,
        "sources_changed_since": stale,  # non-empty: the figures are for the older code
    }
    report.write_json(args.results / "ingest.json", result)
    report.write_chart(args.results / "ingest.png", result)
    if result["worker_breakdown"]:
        b = result["worker_breakdown"]
        print(
            f"\nworker time: {b['batches']} batches of ~{b['mean_batch_turns']} turns; "
            f"embed {b['embed_s']}s, store {b['store_s']}s, outside batches {b['outside_batches_s']}s "
            f"of {result['seconds']['ingest_wall']}s wall"
        )
    print(f"\nwrote {args.results / 'ingest.json'} and {args.results / 'ingest.png'}\n")
    print(report.markdown(result))
    print("\nThe stack is left running; `epistream down` (or `make down`) stops it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
