"""The ingest benchmark: end-to-end ingest against the embedding model alone and a plain COPY, on the
same texts (laid out so that the run closes no segment, see workload.segment_free)."""

from __future__ import annotations

import asyncio
import math
import statistics
from argparse import Namespace
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from epistream.models.embeddings import turn_embedding_text
from epistream.settings.processes import Settings

from . import report
from .cleanup import forget_tenants
from .ingest import IngestFigures, Timed, WarmUp, measure_copy, measure_embedding, measure_ingest, warm_up
from .produce import Record, topic_partitions
from .stack import CpuSnapshot, cpu_report, stale_worker_sources, worker_setting
from .store_state import segments_awaiting_enrichment
from .workload import IngestLayout, Workload, load_workload, segment_free

ROOT = Path(__file__).resolve().parent.parent
QUICK_TURNS = 300
WARMUP_TURNS = 20


def _warmup_records(layout: IngestLayout, run_id: str, partitions: list[int]) -> list[Record]:
    """A tenant of its own: the warm-up's rows must not count towards the measured run. Four
    conversations, one a partition, a second between turns: nothing for the segmenter to close.
    Turn ids are renumbered: the first turns of several LoCoMo conversations share ids (D1:1...)."""
    tenant = f"bench-{run_id}-warmup"
    start = layout.turns[0].ts
    turns = [
        t.model_copy(update={
            "tenant": tenant, "conversation_id": f"{tenant}-{i % 4}", "turn_id": f"W{i}", "session_id": None,
            "ts": start + timedelta(seconds=i),
        })
        for i, t in enumerate(layout.turns[:WARMUP_TURNS])
    ]
    return [Record.of(t, partitions[i % len(partitions)]) for i, t in enumerate(turns)]


def _embedded_texts(workload: Workload) -> list[str]:
    return [turn_embedding_text(t.speaker, t.text, t.ts) for t in workload.turns]


def _breakdown(ingest: IngestFigures) -> dict[str, Any] | None:
    w = ingest.worker
    if w is None or w.batches <= 0:
        return None
    return {
        "batches": int(w.batches),
        "mean_batch_turns": round(w.turns / w.batches, 1),
        "embed_s": round(w.embed_seconds, 3),
        # upsert + commit (+ decode, negligible) not hidden behind the next chunk's embedding
        "store_s": round(w.batch_seconds - w.embed_seconds, 3),
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
    warmup: WarmUp,
) -> dict[str, Any]:
    throughput = {
        "ingest_turns_per_s": round(ingest.turns_per_s, 2),
        "embedding_sentences_per_s": round(embed.per_s, 2),
        "copy_rows_per_s": round(copy.per_s, 1),
    }
    return {
        "workload": workload.source,
        "turns": ingest.turns,
        "tenant": workload.tenant,
        "embedding_batch": settings.embedding_batch, "embedding_model": settings.embedding_model,
        "ingest_batch": settings.ingest_batch,
        "embedded_texts": "[time] speaker: text (turn_embedding_text), on both sides",
        "throughput": throughput,
        "ratios": {
            "ingest_over_embedding": round(ingest.turns_per_s / embed.per_s, 4),
            "ingest_over_copy": round(ingest.turns_per_s / copy.per_s, 5),
            "embedding_over_copy": round(embed.per_s / copy.per_s, 5),
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
        },
        "worker_breakdown": _breakdown(ingest),
        # Per CPU-second of the process doing the work: unlike the rates above, barely moved by
        # neighbours taking cores (the ingest worker's figure leaves out PostgreSQL's and Kafka's CPU).
        "per_cpu_second": _per_cpu_second(ingest, embed),
        "machine": report.machine_info(ROOT),
    }


@dataclass(frozen=True)
class Round:
    """One round: the whole workload ingested end to end, then the embedder alone on the same texts."""

    ingest: IngestFigures
    embed: Timed

    @property
    def ratio(self) -> float:
        return self.ingest.turns_per_s / self.embed.per_s

    def summary(self) -> dict[str, Any]:
        per_cpu = _per_cpu_second(self.ingest, self.embed)
        return {"ingest_turns_per_s": round(self.ingest.turns_per_s, 2),
                "embedding_sentences_per_s": round(self.embed.per_s, 2),
                "ingest_over_embedding": round(self.ratio, 4),
                "per_cpu_ingest_over_embedding": per_cpu["ingest_over_embedding"] if per_cpu else None}


def spread(rounds: list[Round]) -> dict[str, Any]:
    """The rounds' ratios and rates: each round's, and their least, median and greatest."""
    def stats(values: list[float]) -> dict[str, float]:
        return {"min": round(min(values), 4), "median": round(statistics.median(values), 4),
                "max": round(max(values), 4)}
    return {"ingest_over_embedding": stats([r.ratio for r in rounds]),
            "ingest_turns_per_s": stats([r.ingest.turns_per_s for r in rounds]),
            "embedding_sentences_per_s": stats([r.embed.per_s for r in rounds])}


def median_round(rounds: list[Round]) -> Round:
    """The round whose ratio is the median (the lower middle of an even count): the headline figures."""
    return sorted(rounds, key=lambda r: r.ratio)[(len(rounds) - 1) // 2]


def run_ingest(settings: Settings, url: str, run_id: str, args: Namespace) -> dict[str, Any]:
    limit = args.turns if args.turns is not None else (QUICK_TURNS if args.quick else None)
    worker_started, stale = stale_worker_sources(settings, ROOT)
    if stale:
        shown = ", ".join(stale[:4]) + (f" and {len(stale) - 4} more" if len(stale) > 4 else "")
        print(f"  note: the ingest worker (started {worker_started:%H:%M:%S}) predates changes to {shown};")
        print("        `epistream down && epistream up` restarts it on the current code")
    partitions = asyncio.run(topic_partitions(settings))
    max_tokens = int(worker_setting(settings, "segment_max_tokens") or 4096)
    # Each round its own tenant and conversation ids, so every row of every round is an insert.
    sources = [load_workload(run_id=f"{run_id}-r{n}", limit=limit) for n in range(1, args.rounds + 1)]
    layouts = [segment_free(source.turns, partitions=partitions, max_tokens=max_tokens) for source in sources]
    workloads = [Workload(source.source, source.tenant, layout.turns)
                 for source, layout in zip(sources, layouts, strict=True)]
    warmup = _warmup_records(layouts[0], run_id, partitions)
    tenants = [w.tenant for w in workloads] + [f"bench-{run_id}-warmup"]
    print(f"\ningest: {len(workloads[0].turns)} {sources[0].source} turns in {layouts[0].parts} segment-free conversation "
          f"parts, {args.rounds} rounds of ingest then the embedder alone, interleaved")
    awaiting = segments_awaiting_enrichment(url)
    if awaiting:
        print(f"  warning: {awaiting} segment(s) of this stack await enrichment: the model server will take cores "
              "from the figures below (the JSON's `alone` says so)")
    rounds: list[Round] = []
    started = CpuSnapshot.take()
    try:
        print(f"warm-up: {len(warmup)} turns through the worker")
        warmed = warm_up(settings, url, warmup)
        print(f"  done in {warmed.seconds:.1f}s, latency p50 {warmed.latency_p50_s:.2f}s")
        for n, (workload, layout) in enumerate(zip(workloads, layouts, strict=True), start=1):
            print(f"round {n}/{args.rounds}: ingest end to end (tenant {workload.tenant})")
            ingest = measure_ingest(settings, url, workload.tenant, layout.records)
            print(f"  {ingest.turns_per_s:.1f} turns/s ({ingest.wall_s:.1f}s)")
            # After the ingest run: the embedder would otherwise fight the worker for the cores. What the
            # worker embeds ([time] speaker: text), not the bare text: the same work on both sides.
            embed, vectors = measure_embedding(settings, _embedded_texts(workload))
            rounds.append(Round(ingest, embed))
            print(f"  embedding model alone: {embed.per_s:.1f} sentences/s ({embed.seconds:.1f}s); "
                  f"ratio {rounds[-1].ratio:.2f}")
        cpu = cpu_report(settings, started, CpuSnapshot.take())
        print("plain COPY")
        copy = measure_copy(url, workloads[-1].turns, vectors, run_id=run_id)
        print(f"  temp table: {copy.per_s:.0f} rows/s ({copy.seconds:.2f}s)")
    finally:
        cleanup: dict[str, Any] = {"kept": args.keep}
        if not args.keep:
            cleanup["removed"] = forget_tenants(url, tenants)
            print(f"removed the ingest run's rows ({cleanup['removed'].get('turns', 0)} turns)")

    middle = median_round(rounds)
    workload = workloads[rounds.index(middle)]
    result = build_result(workload, settings, middle.ingest, middle.embed, copy, warmed)
    result["rounds"] = {
        "count": len(rounds),
        "each": [r.summary() for r in rounds],
        "spread": spread(rounds),
        "note": "each round ingests the whole workload under a tenant of its own, then runs the embedder alone "
        "on the same texts; the headline figures are the round with the median ratio",
    }
    # Whether the rounds had the machine to themselves: what else ran is in `cpu.top_processes`.
    result["alone"] = {"segments_awaiting_enrichment_at_start": awaiting, "cpu": cpu}
    result["layout"] = {
        "conversation_parts": layouts[0].parts,
        "note": "segment-free: no session ids, 1 s between turns, conversations split under the token budget, "
        "parts spread over the partitions and advancing together, tenant sealed right after the run; "
        "texts, speakers and turn ids as in LoCoMo, so embedding and storage work are unchanged",
    }
    result["worker"] = {
        "started_at": worker_started.isoformat(timespec="seconds") if worker_started else None,
        "sources_changed_since": stale,  # non-empty: the figures are for the older code
        "ingest_chunk": worker_setting(settings, "ingest_chunk"),  # the worker's, as its supervisor records it
    }
    result["cleanup"] = cleanup
    if result["worker_breakdown"]:
        b = result["worker_breakdown"]
        print(
            f"\nworker time (median round): {b['batches']} batches of ~{b['mean_batch_turns']} turns; "
            f"embed {b['embed_s']}s, store {b['store_s']}s, outside batches {b['outside_batches_s']}s "
            f"of {result['seconds']['ingest_wall']}s wall"
        )
    report.write_results(args.results / "ingest.json", result, write_chart, markdown)
    return result


# --- the chart and the markdown -------------------------------------------------------------------

def write_chart(result: dict[str, Any], path: Path) -> None:
    t = result["throughput"]
    labels = ["ingest\n(end to end)", "embedding\nmodel only", "COPY\n(temp table)"]
    values = [t["ingest_turns_per_s"], t["embedding_sentences_per_s"], t["copy_rows_per_s"]]
    colors = ["#d62728", "#1f77b4", "#2ca02c"]
    fig, ax = report.subplots(figsize=(7.5, 4.5))
    report.bars(ax, labels, values, colors, label="{:,.0f}/s")
    ax.set_yscale("log")
    ax.set_ylabel("items per second (log scale)")
    ax.set_title(f"epistream ingest, {result['turns']} {result['workload']} turns, {result['machine']['nproc']} CPUs")
    r = result["ratios"]
    ax.text(
        0.02,
        0.97,
        f"ingest / embedding = {r['ingest_over_embedding']:.2f}\n"
        f"ingest / COPY = {r['ingest_over_copy']:.3f}\n"
        f"embedding / COPY = {r['embedding_over_copy']:.3f}",
        transform=ax.transAxes,
        va="top",
        fontsize=9,
        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "#ccc"},
    )
    # Bars start at a power of ten below the smallest, so heights compare orders of magnitude.
    ax.set_ylim(bottom=10 ** math.floor(math.log10(min(values))), top=max(values) * 4)
    report.save(fig, path, dpi=120)


def markdown(result: dict[str, Any]) -> str:
    t, r, lat = result["throughput"], result["ratios"], result["latency_s"]
    m = result["machine"]
    rows = [
        ["ingest end to end (Kafka -> worker -> PostgreSQL)", f"{t['ingest_turns_per_s']:,.1f} turns/s", "1.00x"],
        [f"embedding model only ({result.get('embedding_model', 'ONNX')}, batch {result['embedding_batch']})",
         f"{t['embedding_sentences_per_s']:,.1f} sentences/s", f"{1 / r['ingest_over_embedding']:.2f}x"],
        ["plain COPY, temp table with all indexes", f"{t['copy_rows_per_s']:,.0f} rows/s",
         f"{1 / r['ingest_over_copy']:.1f}x"],
    ]
    rows += [
        ["produce -> searchable latency p50 / p95, all turns sent at once",
         f"{lat['p50']:.2f} s / {lat['p95']:.2f} s", ""],
        ["produce -> searchable latency p50, idle worker (warm-up turns)", f"{lat['unloaded_p50']:.2f} s", ""],
    ]
    lines = [
        f"Ingest benchmark: {result['turns']} turns ({result['workload']}), {m['nproc']} CPUs, "
        f"Python {m['python']}, commit {m['git_commit'] or 'unknown'}, {m['timestamp']}",
        "",
        report.table(["measure", "rate", "vs ingest"], rows),
        "",
        *_breakdown_line(result.get("worker_breakdown"), result["seconds"]["ingest_wall"]),
        *_per_cpu_line(result.get("per_cpu_second")),
        *_rounds_line(result.get("rounds")),
        f"Ratios: ingest/embedding {r['ingest_over_embedding']:.2f}, ingest/COPY {r['ingest_over_copy']:.3f}, "
        f"embedding/COPY {r['embedding_over_copy']:.3f}.",
    ]
    return "\n".join(lines)


def _breakdown_line(b: dict[str, Any] | None, wall_s: float) -> list[str]:
    """Where the worker's wall time went, from its own histograms (absent when /metrics was unreadable)."""
    if not b:
        return []
    share = {k: 100 * b[k] / wall_s for k in ("embed_s", "store_s", "outside_batches_s")}
    return [
        f"Ingest wall time: embedding {share['embed_s']:.0f}%, upsert+commit {share['store_s']:.0f}%, "
        f"outside batches (Kafka, Faust, waits) {share['outside_batches_s']:.0f}% "
        f"({b['batches']} batches of ~{b['mean_batch_turns']:.0f} turns).",
        "",
    ]


def _per_cpu_line(per_cpu: dict[str, float] | None) -> list[str]:
    if not per_cpu:
        return []
    return [
        f"Per CPU-second: ingest worker {per_cpu['ingest_worker_turns']:.1f} turns, embedding "
        f"{per_cpu['embedding_sentences']:.1f} sentences (ratio {per_cpu['ingest_over_embedding']:.2f}).",
        "",
    ]


def _rounds_line(rounds: dict[str, Any] | None) -> list[str]:
    if not rounds:
        return []
    ratio = rounds["spread"]["ingest_over_embedding"]
    each = ", ".join(f"{r['ingest_over_embedding']:.2f}" for r in rounds["each"])
    return [f"Over {rounds['count']} interleaved rounds, ingest/embedding {each} (median {ratio['median']:.2f}, "
            f"{ratio['min']:.2f}-{ratio['max']:.2f}); the figures above are the median round's.", ""]
