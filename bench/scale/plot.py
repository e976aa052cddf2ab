"""The scale report's figure: cost per operation against memory size, log-log."""

from __future__ import annotations

from pathlib import Path


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = report["points"]
    turns = [p["turns"] for p in points]
    fig, (reads, load, disk) = plt.subplots(1, 3, figsize=(15, 4.5))
    for case in points[0]["reads"]:
        for stat, style in (("p50_ms", "-o"), ("p95_ms", "--o")):
            reads.plot(turns, [p["reads"][case][stat] for p in points], style, label=f"{case} {stat[:3]}")
    projected = report.get("projection")
    if projected:  # dotted, from the last measured size: a projection, not a measurement
        ends = [turns[-1], projected["turns"]]
        for case, stats in projected["reads"].items():
            for stat, figure in stats.items():
                reads.plot(ends, [points[-1]["reads"][case][stat], figure["value"]], ":", color="grey", linewidth=0.8)
        disk.plot(ends, [points[-1]["disk"]["bytes_per_turn"], projected["bytes_per_turn"]["value"]], ":",
                  color="grey", linewidth=0.8, label=f"projected to {projected['turns']:,}")
    reads.axhline(50, color="grey", linewidth=0.8, linestyle=":", label="goal p95 50 ms")
    reads.set(title=f"context read ({report['budget_tokens']} tokens)", ylabel="ms per read")
    load.plot(turns, [1000 / p["load"]["rows_per_s"] for p in points], "-o", label="COPY into memory.turns")
    load.plot(turns, [1000 / p["load"]["unindexed_rows_per_s"] for p in points], "-o", label="COPY, no index")
    load.plot(turns, [max(p["load"]["index_ms_per_row"], 1e-3) for p in points], "--o", label="indexes' share")
    load.set(title="storage cost per turn", ylabel="ms per turn")
    disk.plot(turns, [p["disk"]["bytes_per_turn"] for p in points], "-o", label="table + indexes")
    disk.plot(turns, [p["disk"]["index_bytes_per_turn"]["turns_embedding_idx"] for p in points], "--o",
              label="HNSW index")
    disk.set(title="disk per turn", ylabel="bytes per turn")
    for ax in (reads, load, disk):
        ax.set(xscale="log", yscale="log", xlabel="turns in memory")
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
