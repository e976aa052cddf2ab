"""The scale curve carried past what was measured: each figure's log-log slope between the two
largest measured sizes, extended to a target size (10M by default). A projection, labelled so in
the report and drawn dashed: it assumes the last measured growth rate holds, which a change of
regime (the working set leaving memory, a plan change) would break.

    python -m bench.scale.projection [bench/results/scale.json] [--to 10000000]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from .plot import plot

DEFAULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "scale.json"


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, nargs="?", default=DEFAULT)
    parser.add_argument("--to", type=int, default=10_000_000)
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    report["projection"] = project(report, args.to)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.report.with_suffix(".png"))
    print(json.dumps(report["projection"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
