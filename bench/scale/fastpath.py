"""Produce-to-searchable while enrichment runs, with the model server at each niceness, in one run.

    python -m bench.scale.fastpath [--start] [--nice 0,10] [--seconds 60]

On a machine whose cores the embedder and the model server share, a turn waits for the embedder
while llama.cpp computes. This measure keeps the model busy (a backlog of closed segments for the
enrich worker), then streams fresh turns at half the embedder's measured rate on the same texts, once
per niceness of the running model server (all its threads reniced in place; the setting
EPISTREAM_MODEL_NICE starts it at its default), and reads each turn's stored_at - produced_at.
Writes bench/results/fastpath.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg

from bench.cleanup import forget_tenants, seal_tenant
from bench.ingest import row_timings, wait_for_rows
from bench.produce import Record, send_burst, send_steady
from bench.stack import managed_pid, process_cpu_seconds
from epistream.db import admin_database_url
from epistream.embeddings import Embedder, turn_embedding_text
from epistream.settings import Settings

from ..report import write_results
from ..workload_scale import WorkloadSpec, turns

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench" / "results" / "fastpath.json"
#: Sessions of 20 turns close one segment each: this backlog keeps the 2-core model server busy for
#: longer than every phase together (about 40 s a segment there).
#: The phase with the model server paused (SIGSTOP): the fast path's own floor at this rate.
STOPPED = "stopped"
#: The streamed turns' shape (the capacity probe embeds the same kind of texts).
STREAM = dict(tenants=1, conversations_per_tenant=8, sessions_per_conversation=40, turns_per_session=20)
BACKLOG = dict(tenants=1, conversations_per_tenant=6, sessions_per_conversation=4, turns_per_session=20)


def renice(pid: int, niceness: int) -> int:
    """Set every thread of `pid` to `niceness` (threads keep their own); how many were set."""
    tasks = os.listdir(f"/proc/{pid}/task")
    for task in tasks:
        os.setpriority(os.PRIO_PROCESS, int(task), niceness)
    return len(tasks)


def pending_segments(url: str, tenant: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM memory.segments WHERE tenant = %s AND status = 'pending'",
                            (tenant,)).fetchone()[0]  # type: ignore[index]


def embedder_rate(settings: Settings, texts: list[str]) -> float:
    embedder = Embedder.from_settings(settings)
    embedder.embed(texts[:64])
    started = time.perf_counter()
    embedder.embed(texts)
    return len(texts) / (time.perf_counter() - started)


def phase(settings: Settings, url: str, tenant: str, rate: float, seconds: float, niceness: int | str,
          model_pid: int) -> dict:
    spec = WorkloadSpec(**STREAM, prefix=tenant)  # type: ignore[arg-type]
    records = [Record.of(t) for t in itertools.islice(turns(spec), int(rate * seconds))]
    stopped = niceness == STOPPED
    threads = renice(model_pid, settings.model_nice if stopped else niceness)
    model_before, started = process_cpu_seconds(model_pid), time.perf_counter()
    if stopped:
        os.kill(model_pid, signal.SIGSTOP)
    try:
        sent = asyncio.run(send_steady(settings, records, rate))
        wait_for_rows(url, f"{tenant}-t000", len(records))
    finally:
        if stopped:
            os.kill(model_pid, signal.SIGCONT)
    seal_tenant(url, f"{tenant}-t000")  # its own segments would only lengthen the backlog
    model_after, wall = process_cpu_seconds(model_pid), time.perf_counter() - started
    latencies, _ = row_timings(url, f"{tenant}-t000")
    p50, p95 = np.percentile(latencies, [50, 95])
    return {"model_nice": niceness, "model_threads_reniced": threads, "turns": len(records), "rate_per_s": rate,
            "achieved_per_s": round(sent.achieved_per_s, 1), "p50_ms": round(1000 * p50, 1),
            "p95_ms": round(1000 * p95, 1), "max_ms": round(1000 * latencies.max(), 1),
            "model_cpu_share": round((model_after - model_before) / wall / os.cpu_count(), 3)  # type: ignore[operator]
            if model_before is not None and model_after is not None else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nice", default=f"0,10,19,{STOPPED}",
                        help=f"model server niceness per phase, in this order ({STOPPED}: paused)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase's stream")
    parser.add_argument("--share", type=float, default=0.5, help="stream rate, as a share of the embedder's rate")
    parser.add_argument("--start", action="store_true", help="start the embedded stack first")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    settings = Settings()
    if args.start:
        from epistream.infra import services
        services.up(settings)
    url = admin_database_url(settings)
    model_pid = managed_pid(settings, "model-server")
    if model_pid is None:
        raise SystemExit("the model server is not running (start the stack, or pass --start)")
    run = f"bench-fastpath-{uuid.uuid4().hex[:6]}"
    texts = [turn_embedding_text(t.speaker, t.text, t.ts) for t in itertools.islice(
        turns(WorkloadSpec(**STREAM, prefix=f"{run}-probe")), 1000)]  # type: ignore[arg-type]
    os.kill(model_pid, signal.SIGSTOP)  # the embedder alone on these cores, whatever the model was doing
    try:
        capacity = embedder_rate(settings, texts)
    finally:
        os.kill(model_pid, signal.SIGCONT)
    rate = round(args.share * capacity, 1)
    backlog = f"{run}-backlog"
    records = [Record.of(t) for t in turns(WorkloadSpec(**BACKLOG, prefix=backlog))]  # type: ignore[arg-type]
    asyncio.run(send_burst(settings, records))
    wait_for_rows(url, f"{backlog}-t000", len(records))
    phases = []
    try:
        for niceness in (n if n == STOPPED else int(n) for n in args.nice.split(",")):
            pending = pending_segments(url, f"{backlog}-t000")
            result = phase(settings, url, f"{run}-n{niceness}", rate, args.seconds, niceness, model_pid)
            result["backlog_segments_pending_at_start"] = pending
            print(json.dumps(result), flush=True)
            phases.append(result)
    finally:
        renice(model_pid, settings.model_nice)
        seal_tenant(url, f"{backlog}-t000")
        forget_tenants(url, [f"{backlog}-t000"] + [f"{run}-n{p['model_nice']}-t000" for p in phases])
    report = {"what": "produce -> searchable (memory.turns.stored_at - Kafka produced_at, a lower bound) of turns "
                      "streamed at a steady rate while the enrich worker works through a backlog, per niceness "
                      "of the model server", "embedder_turns_per_s": round(capacity, 1), "cpus": os.cpu_count(),
              "load_average": list(os.getloadavg()), "phases": phases}
    write_results(args.out, report, plot)
    return 0


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = report["phases"]
    labels = [f"model nice {p['model_nice']}" for p in phases]
    x = np.arange(len(phases))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(x - 0.2, [p["p50_ms"] for p in phases], 0.4, label="p50")
    ax.bar(x + 0.2, [p["p95_ms"] for p in phases], 0.4, label="p95")
    ax.axhline(1000, color="grey", linestyle=":", linewidth=0.8, label="goal p95 1 s")
    ax.set(xticks=x, xticklabels=labels, ylabel="produce -> searchable, ms", yscale="log",
           title=f"fast path under enrichment, {phases[0]['rate_per_s'] if phases else 0} turns/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
