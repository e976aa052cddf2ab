"""The suite's results: bench/results/faults.json, faults.png (per scenario: produced, stored, lost,
duplicated, dead-lettered, time to recover) and a markdown table for docs/benchmarks/faults.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import report
from bench.report import machine_info

JSON_NAME = "faults.json"
BARS = (("produced", "#7f7f7f"), ("stored", "#2ca02c"), ("lost", "#d62728"), ("duplicated", "#ff7f0e"),
        ("dead_lettered", "#9467bd"))


def failed_invariants(scenario: dict[str, Any]) -> list[str]:
    return [n for n, v in scenario["invariants"].items() if v["status"] != "ok"]


def build(root: Path, options: dict[str, Any], scenarios: list[dict[str, Any]],
          hostile: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "suite": "faults", "options": options, "machine": machine_info(root),
        "scenarios": scenarios,
        "hostile": hostile if hostile is not None else {"cases": 0, "failed": 0, "skipped": True},
        "summary": {
            "scenarios": len(scenarios),
            "lost": sum(s["lost"] for s in scenarios),
            "duplicated": sum(s["duplicated"] for s in scenarios),
            "scenarios_with_failed_invariants": [s["name"] for s in scenarios if failed_invariants(s)],
        },
    }


def write(results: Path, result: dict[str, Any], *, final: bool = False) -> None:
    """The JSON and the chart; the final write prints the markdown table too."""
    report.write_results(results / JSON_NAME, result, write_chart, markdown if final else None)


def write_chart(result: dict[str, Any], path: Path) -> None:
    scenarios = result["scenarios"]
    names = [s["name"] for s in scenarios]
    fig, (counts, recover) = report.subplots(2, 1, figsize=(max(8, 1.1 * len(names) + 3), 8), sharex=True)
    report.grouped_bars(counts, len(names), [(field.replace("_", "-"), [s[field] for s in scenarios], color)
                                             for field, color in BARS])
    counts.set_ylabel("records")
    counts.set_title("fault-injection suite: per scenario")
    counts.legend(ncols=len(BARS), fontsize=8)
    colors = ["#d62728" if failed_invariants(s) else "#2ca02c" for s in scenarios]
    recover.bar(range(len(names)), [s["recover_s"] for s in scenarios], color=colors)
    recover.set_ylabel("time to recover (s)\nred: an invariant failed")
    recover.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    report.save(fig, path)


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for s in result["scenarios"]:
        bad = failed_invariants(s)
        rows.append([s["name"], s["produced"], s["stored"], s["lost"], s["duplicated"], s["dead_lettered"],
                     s["recover_s"], "failed: " + ", ".join(bad) if bad else "ok"])
    h = result["hostile"]
    return (report.table(["scenario", "produced", "stored", "lost", "duplicated", "dead-lettered", "recover s",
                          "invariants"], rows, "lrrrrrrl")
            + f"\n\nHostile inputs: {h.get('cases', 0)} cases, {h.get('failed', 0)} failed"
            + (f" ({h['source']})" if h.get("source") else ""))
