"""python -m bench.scale.reread DATABASE --label NAME [--migrate]: bench.scale's context reads again on a
database it kept (``python -m bench.scale --keep`` prints its name), after applying the pending migrations
(timed) when asked: one change measured before and after on the same rows, the same questions and the
same machine. Each run is added under its label to bench/results/scale-reread.json (and .png), so the
runs to compare sit side by side.

    python -m bench.scale --sizes 10000,100000 --keep        # with the change's migration set aside
    python -m bench.scale.reread scale_bench_1a2b3c4d --label before
    python -m bench.scale.reread scale_bench_1a2b3c4d --label after --migrate
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from epistream.db import admin_database_url, apply_migrations, database_url, on_database
from epistream.embeddings import Embedder
from epistream.settings import Settings

from ..report import write_results
from ..workload_scale import PRESETS
from .__main__ import ROOT, cases, read_all, tenant_turns
from .disk import disk_usage, postgres_settings

DEFAULT_OUT = ROOT / "bench" / "results" / "scale-reread.json"


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    chosen = list(runs[0]["reads"])
    fig, axes = plt.subplots(1, len(chosen), figsize=(6 * len(chosen), 4.5), squeeze=False)
    for ax, case in zip(axes[0], chosen, strict=True):
        labels = [r["label"] for r in runs]
        for offset, stat in ((-0.2, "p50_ms"), (0.2, "p95_ms")):
            ax.bar([i + offset for i in range(len(runs))], [r["reads"][case][stat] for r in runs], width=0.4,
                   label=stat[:3])
        for i, r in enumerate(runs):
            ax.annotate(f"recall {r['reads'][case]['recall_vs_exact']}", (i, 0), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(runs)), labels)
        ax.axhline(50, color="grey", linewidth=0.8, linestyle=":", label="goal p95 50 ms")
        ax.set(title=f"{case}, {runs[0]['turns']} turns", ylabel="ms per context read")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database", help="a database bench.scale kept")
    parser.add_argument("--label", required=True, help="this run's name in the results (e.g. before, after)")
    parser.add_argument("--migrate", action="store_true", help="apply the pending migrations first (timed)")
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--recall-questions", type=int, default=30)
    parser.add_argument("--budget", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    settings = Settings()
    url = make_conninfo(admin_database_url(settings), dbname=args.database)
    migrated: dict = {}
    if args.migrate:
        started = time.perf_counter()
        migrated = {"applied": apply_migrations(url), "seconds": round(time.perf_counter() - started, 2)}
    chosen = cases(PRESETS["1m"], args.questions)
    with psycopg.connect(url, autocommit=True) as conn:
        turns = conn.execute("SELECT count(*) FROM memory.turns").fetchone()[0]  # type: ignore[index]
        last_ts = conn.execute("SELECT max(ts) FROM memory.turns").fetchone()[0]  # type: ignore[index]
        conn.execute("VACUUM ANALYZE memory.turns")
        own = on_database(settings, url)
        reads = asyncio.run(read_all(own, database_url(own), Embedder.from_settings(own), chosen, asked_at=last_ts,
                                     budget=args.budget, recall_questions=args.recall_questions))
        for case in chosen:
            reads[case.name]["case_turns"] = tenant_turns(conn, case)
        run = {"label": args.label, "turns": turns, "migrated": migrated, "reads": reads,
               "disk": disk_usage(conn, turns), "postgres_settings": postgres_settings(conn),
               "load_average": list(os.getloadavg())}
    print(json.dumps(run), flush=True)
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs = [r for r in report.get("runs", []) if r["label"] != args.label or r["turns"] != turns]
    report = {"what": "bench.scale's context reads on one kept database, run by run (bench.scale.reread)",
              "budget_tokens": args.budget, "runs": [*runs, run]}
    write_results(args.out, report, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
