"""``python -m bench.ingest_chunks [--start-postgres] [--chunks 128,32] [--embedding-batches 64,8] [--rounds 2]``: the
fast path's own rate, in process, per chunk size, side by side with the bare embedding model.

The worker's ``epistream.pipeline.ingest.ingest_batch`` stores the LoCoMo dev split in Kafka-sized batches
(`EPISTREAM_INGEST_BATCH` records, in the segment-free produce order of ``bench.run --only ingest``) into
a scratch database on the running PostgreSQL, once per chunk size and round, alternating (ABAB), each
pass on a fresh tenant, so drift on a shared machine falls on every variant alike. A chunk as large as
the batch is the behaviour before issue 13 (embed the whole batch, then one transaction). The bare model
embeds the same texts (`[time] speaker: text`, what the worker embeds): all at once, length-sorted across
the whole split (what ``bench.run`` calls the embedding model alone), and batch by batch (the most a
worker that sees one batch at a time can sort). Each ONNX batch size (`EPISTREAM_EMBEDDING_BATCH`) asked
for is measured the same way: an ONNX batch is padded to its longest text, so how much the length sort
saves depends on how many texts it sorts and how finely they are cut. No Kafka, no Faust: those were 1%
of the worker's time. Writes bench/results/ingest-chunks.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epistream.contracts import Turn
from epistream.db import create_pool, on_database
from epistream.embeddings import Embedder, turn_embedding_text
from epistream.metrics import Metrics
from epistream.pipeline.ingest import ingest_batch
from epistream.pipeline.records import RawRecord
from epistream.pipeline.store.segments import config_from
from epistream.settings import Settings, load_settings

from . import report
from .scratch_db import scratch_database
from .workload import load_workload, segment_free

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = [0, 1, 2, 3]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ingest_chunks", description=__doc__.splitlines()[0])
    p.add_argument("--start-postgres", action="store_true", help="start the embedded PostgreSQL first")
    p.add_argument("--chunks", default="128,32", help="chunk sizes to compare (default 128,32)")
    p.add_argument("--embedding-batches", default="64,16",
                   help="ONNX batch sizes (EPISTREAM_EMBEDDING_BATCH) to compare (default 64,16: the old and new default)")
    p.add_argument("--rounds", type=int, default=2, help="passes per chunk size, alternating (default 2)")
    p.add_argument("--turns", type=int, help="first N turns (default: the whole dev split)")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    return p.parse_args(argv)


def _timed(work: Callable[[], Any]) -> tuple[float, float]:
    """Wall and this process's CPU seconds of `work`."""
    started, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - started, time.process_time() - cpu


def _batches(settings: Settings, run_id: str, tenant: str, limit: int | None) -> list[list[RawRecord]]:
    """The workload's records under `tenant`, cut as the agent takes them from Kafka."""
    source = load_workload(ROOT, run_id=run_id, limit=limit)
    layout = segment_free(source.turns, partitions=PARTITIONS, max_tokens=settings.segment_max_tokens)
    recs = [RawRecord("memory.turns", r.partition or 0, i, r.key, t.model_copy(update={"tenant": tenant}).to_bytes())
            for i, (t, r) in enumerate(zip(layout.turns, layout.records, strict=True))]
    size = settings.ingest_batch
    return [recs[i:i + size] for i in range(0, len(recs), size)]


def _sum_of(metrics: Metrics, name: str) -> float:
    return float(metrics.registry.get_sample_value(f"{name}_sum") or 0.0)


async def _ingest_pass(url: str, settings: Settings, embedder: Embedder, batches: list[list[RawRecord]],
                       chunk: int) -> dict[str, float]:
    pool = create_pool(on_database(settings, url))
    await pool.open(wait=True)
    metrics, segmenter = Metrics.create(), config_from(settings)
    try:
        started, cpu, stored = time.perf_counter(), time.process_time(), 0
        for batch in batches:
            result = await ingest_batch(batch, pool=pool, embedder=embedder, metrics=metrics, segmenter=segmenter,
                                        chunk_turns=chunk)
            if result.dead:
                raise RuntimeError(f"{len(result.dead)} records set aside: {result.dead[0].error}")
            stored += len(result.stored)
        wall, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    finally:
        await pool.close()
    return {"chunk": chunk, "turns": stored, "seconds": round(wall, 3), "turns_per_s": round(stored / wall, 2),
            "cpu_s": round(cpu_s, 2),
            "embedding_s": round(_sum_of(metrics, "epistream_embedding_duration_seconds"), 3),
            "loadavg_1m": os.getloadavg()[0]}


def _bare(embedder: Embedder, texts: list[str], group: int) -> dict[str, float]:
    """The bare model on the texts, all at once (length-sorted across them) and `group` at a time."""
    whole = _timed(lambda: embedder.embed(texts))
    grouped = _timed(lambda: [embedder.embed(texts[i:i + group]) for i in range(0, len(texts), group)])
    return {"whole_split_sentences_per_s": round(len(texts) / whole[0], 2), "whole_split_cpu_s": round(whole[1], 2),
            "per_batch_sentences_per_s": round(len(texts) / grouped[0], 2), "per_batch_cpu_s": round(grouped[1], 2)}


def measure(settings: Settings, url: str, run_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """Per round and ONNX batch size: the bare model, then each chunk size right after it, so a
    neighbour's load that comes and goes falls on a ratio's two sides alike."""
    batches = _batches(settings, run_id, f"bench-chunks-{run_id}-bare", args.turns)
    turns = [Turn.from_bytes(r.value) for b in batches for r in b]  # type: ignore[arg-type]
    texts = [turn_embedding_text(t.speaker, t.text, t.ts) for t in turns]
    sizes = [int(b) for b in args.embedding_batches.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    embedders = {b: Embedder.from_settings(settings.with_overrides(embedding_batch=b)) for b in sizes}
    for size, embedder in embedders.items():
        embedder.embed(texts[:size])  # ORT allocates its buffers on the first run
    passes = []
    for rnd in range(args.rounds):
        for size, embedder in embedders.items():
            bare = _bare(embedder, texts, settings.ingest_batch)
            print(f"  round {rnd} ONNX batch {size:>3} bare model: {bare}", flush=True)
            for chunk in chunks:
                own = _batches(settings, run_id, f"bench-chunks-{run_id}-{size}-{chunk}-{rnd}", args.turns)
                figures: dict[str, Any] = _run_pass(url, settings, embedder, own, chunk)
                figures.update(embedding_batch=size, round=rnd, bare=bare,
                               over_whole_split=round(figures["turns_per_s"] / bare["whole_split_sentences_per_s"], 4))
                print(f"  round {rnd} ONNX batch {size:>3} chunk {chunk:>4}: {figures['turns_per_s']} turns/s, "
                      f"{figures['over_whole_split']} of the bare model (load {figures['loadavg_1m']:.2f})", flush=True)
                passes.append(figures)
    reference = max(p["bare"]["whole_split_sentences_per_s"] for p in passes)
    return {
        "turns": len(texts),
        "ingest_batch": settings.ingest_batch,
        "passes": passes,
        "note": "keys 'ONNX batch/chunk': median over rounds of the ingest rate over the bare model's rate on "
                "the whole split with the same ONNX batch, measured just before; 'vs_best_bare' divides by the "
                "best bare rate of any ONNX batch in the run",
        "ingest_over_embedding": {f"{s}/{c}": _median([p["over_whole_split"] for p in passes
                                                       if p["embedding_batch"] == s and p["chunk"] == c])
                                  for s in sizes for c in chunks},
        "vs_best_bare": {f"{s}/{c}": round(_median([p["turns_per_s"] for p in passes
                                                    if p["embedding_batch"] == s and p["chunk"] == c]) / reference, 4)
                         for s in sizes for c in chunks},
        "machine": report.machine_info(ROOT),
    }


def _run_pass(url: str, settings: Settings, embedder: Embedder, batches: list[list[RawRecord]],
               chunk: int) -> dict[str, Any]:
    return asyncio.run(_ingest_pass(url, settings, embedder, batches, chunk))


def _median(values: list[float]) -> float:
    return round(float(statistics.median(values)), 4)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = load_settings()
    run_id = time.strftime("%Y%m%dt%H%M%S")
    with scratch_database(settings, "bench_chunks", start_postgres=args.start_postgres) as url:
        result = measure(settings, url, run_id, args)
    report.write_json(args.results / "ingest-chunks.json", result)
    print(result["ingest_over_embedding"], result["vs_best_bare"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
