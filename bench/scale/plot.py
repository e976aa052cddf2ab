"""The scale report's figure (cost per operation against memory size, log-log) and its projection: the
curve carried past what was measured, each figure's log-log slope between the two largest measured sizes
extended to a target size (10x the largest by default). A projection, labelled so in the report and drawn
dotted: it assumes the last measured growth rate holds, which a change of regime (the working set leaving
memory, a plan change) would break."""

from __future__ import annotations

import math
from pathlib import Path

from ..report import save, subplots


def extend(x0: float, y0: float, x1: float, y1: float, x: float) -> tuple[float, float]:
    """(value at x, log-log slope) of the power law through (x0, y0) and (x1, y1)."""
    slope = math.log(y1 / y0) / math.log(x1 / x0)
    return y1 * (x / x1) ** slope, slope


def project(report: dict, to_turns: int) -> dict:
    """Per read case p50/p95 and per-turn disk, projected from the two largest measured sizes."""
    first, last = sorted(report["points"], key=lambda p: p["turns"])[-2:]
    x0, x1 = first["turns"], last["turns"]

    def one(y0: float, y1: float) -> dict:
        value, slope = extend(x0, y0, x1, y1, to_turns)
        return {"value": round(value, 1), "slope": round(slope, 3)}

    reads = {case: {stat: one(first["reads"][case][stat], last["reads"][case][stat]) for stat in ("p50_ms", "p95_ms")}
             for case in last["reads"]}
    disk = one(first["disk"]["bytes_per_turn"], last["disk"]["bytes_per_turn"])
    return {"turns": to_turns, "from_turns": [x0, x1], "reads": reads, "bytes_per_turn": disk,
            "disk_gb": round(disk["value"] * to_turns / 1e9, 1),
            "method": "power law through the two largest measured sizes (log-log slope), extended"}


def plot(report: dict, out: Path) -> None:
    points = report["points"]
    turns = [p["turns"] for p in points]
    fig, (reads, load, disk) = subplots(1, 3, figsize=(15, 4.5))
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
    save(fig, out)
