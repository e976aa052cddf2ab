"""Results as JSON, a bar chart and a markdown table."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def git_commit(root: Path) -> str | None:
    """HEAD's short hash, read from .git directly: no git process, so nothing can touch the work tree."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:7]
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()[:7]
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:7]
    except OSError:
        pass
    return None


def machine_info(root: Path) -> dict[str, Any]:
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],  # other tenants of the cores show here
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_commit": git_commit(root),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def write_results(path: Path, result: dict[str, Any], plot: Callable[[dict, Path], None] | None = None) -> None:
    """A benchmark's JSON at `path` and, given a plot, its PNG beside it."""
    write_json(path, result)
    if plot is not None:
        plot(result, path.with_suffix(".png"))
    print(f"wrote {path}" + (f" and {path.with_suffix('.png')}" if plot is not None else ""))


def subplots(*args: Any, **kwargs: Any) -> Any:
    """``plt.subplots`` on the headless backend (no display on CI or servers); matplotlib loads only to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save(fig: Any, path: Path, *, dpi: int = 110) -> None:
    """Lay the figure out, write it as a PNG and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def write_chart(path: Path, result: dict[str, Any]) -> None:
    t = result["throughput"]
    labels = ["ingest\n(end to end)", "embedding\nmodel only", "COPY\n(temp table)"]
    values = [t["ingest_turns_per_s"], t["embedding_sentences_per_s"], t["copy_rows_per_s"]]
    colors = ["#d62728", "#1f77b4", "#2ca02c"]
    if t.get("copy_logged_rows_per_s"):
        labels.append("COPY\n(logged table)")
        values.append(t["copy_logged_rows_per_s"])
        colors.append("#98df8a")
    fig, ax = subplots(figsize=(7.5, 4.5))
    bars = ax.bar(labels, values, color=colors)
    ax.set_yscale("log")
    ax.set_ylabel("items per second (log scale)")
    ax.set_title(f"epistream ingest, {result['turns']} {result['workload']} turns, {result['machine']['nproc']} CPUs")
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(f"{value:,.0f}/s", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom")
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
    save(fig, path, dpi=120)


def markdown(result: dict[str, Any]) -> str:
    t, r, lat = result["throughput"], result["ratios"], result["latency_s"]
    m = result["machine"]
    lines = [
        f"Ingest benchmark: {result['turns']} turns ({result['workload']}), {m['nproc']} CPUs, "
        f"Python {m['python']}, commit {m['git_commit'] or 'unknown'}, {m['timestamp']}",
        "",
        "| measure | rate | vs ingest |",
        "|---|---:|---:|",
        f"| ingest end to end (Kafka -> worker -> PostgreSQL) | {t['ingest_turns_per_s']:,.1f} turns/s | 1.00x |",
        f"| embedding model only ({result.get('embedding_model', 'ONNX')}, batch {result['embedding_batch']}) "
        f"| {t['embedding_sentences_per_s']:,.1f} sentences/s | {1 / r['ingest_over_embedding']:.2f}x |",
        f"| plain COPY, temp table with all indexes | {t['copy_rows_per_s']:,.0f} rows/s | {1 / r['ingest_over_copy']:.1f}x |",
    ]
    if t.get("copy_logged_rows_per_s"):
        lines.append(
            f"| plain COPY, logged table with all indexes | {t['copy_logged_rows_per_s']:,.0f} rows/s "
            f"| {t['copy_logged_rows_per_s'] / t['ingest_turns_per_s']:.1f}x |"
        )
    lines += [
        f"| produce -> searchable latency p50 / p95, all turns sent at once | {lat['p50']:.2f} s / {lat['p95']:.2f} s | |",
        f"| produce -> searchable latency p50, idle worker (warm-up turns) | {lat['unloaded_p50']:.2f} s | |",
        "",
        *_breakdown_line(result.get("worker_breakdown"), result["seconds"]["ingest_wall"]),
        *_cores_line(result.get("cores_used"), m["nproc"]),
        *_per_cpu_line(result.get("per_cpu_second")),
        *_concurrent_line(result.get("concurrent_enrichment")),
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


def _cores_line(cores: dict[str, float | None] | None, nproc: int) -> list[str]:
    if not cores or not all(cores.values()):
        return []
    return [
        f"Cores used (of {nproc}): ingest worker {cores['ingest_worker']:.2f}, embedding {cores['embedding']:.2f}.",
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


def _concurrent_line(concurrent: dict[str, Any] | None) -> list[str]:
    """What else used the cores during the measured run: the model server enriching, neighbours."""
    if not concurrent or not concurrent.get("cpu"):
        return []
    cpu = concurrent["cpu"]
    others = ", ".join(f"{p['process']} {p['cpu_s']:.0f}" for p in cpu["top_processes"][:4])
    return [
        f"Meanwhile (warm-up + ingest, {cpu['wall_s']:.0f} s x {cpu['cores']} cores): {cpu['machine_busy_cpu_s']:.0f} "
        f"CPU-s used: {others}; extractor model calls finished: {concurrent['extractor_calls']}.",
        "",
    ]
