"""``python -m bench.faults [--only SCENARIO] [--quick] [--out bench/results/]``: the fault-injection suite.

Starts the embedded stack if needed (and leaves it running), runs each scenario on its own (a fresh
tenant each, the stack healthy again before the next), then the hostile inputs; writes faults.json
and faults.png and prints a markdown table. Exit status 1 when any scenario lost or duplicated
something or failed an invariant, or a hostile case failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from epistream.infra import supervisor
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url

from ..stack import up
from . import report, settle, workload
from .hostile import run_hostile
from .runner import run_scenario
from .scenarios import FULL_DURATIONS, QUICK_DURATIONS, SCENARIOS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
# Workers this run starts close segments soon (small budget, short idle), so a scenario's slow path
# finishes within minutes; an exported value wins, and a running stack keeps its own (the checks read it).
WORKER_ENV = {"EPISTREAM_SEGMENT_MAX_TOKENS": "400", "EPISTREAM_SEGMENT_IDLE_S": "3",
              "EPISTREAM_SEGMENT_CHECK_EVERY_S": "1", "EPISTREAM_EVENTS_RELAY_EVERY_S": "1"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", choices=[s.name for s in SCENARIOS] + ["hostile"],
                   help="run this scenario only (repeatable; 'hostile' for the hostile inputs alone)")
    p.add_argument("--quick", action="store_true", help="a smaller workload and shorter outages")
    # Enrichment by the CPU model dominates a scenario's time (about 40 s a segment on 2 busy cores), so the
    # issue's outage lengths can be run on the quick workload: the fault is as long, the stream shorter.
    p.add_argument("--workload", choices=["quick", "full"], help="the workload size, whatever --quick says")
    p.add_argument("--out", type=Path, default=RESULTS, help="where faults.json and faults.png go")
    p.add_argument("--no-hostile", action="store_true", help="skip the hostile inputs")
    return p.parse_args(argv)


def settings_the_running_stack_lacks(settings: Settings) -> list[str]:
    """WORKER_ENV settings a running supervisor was started without (it records its children's settings)."""
    if supervisor.supervisor_pid(settings.state_dir) is None:
        return []
    running = supervisor.read_state(settings.state_dir).get("settings", {})
    wanted = settings.model_dump(mode="json")
    names = [env.removeprefix("EPISTREAM_").lower() for env in WORKER_ENV]
    return [f"{name}={running.get(name)!r}, wanted {wanted[name]!r}" for name in names if running.get(name) != wanted[name]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name, value in WORKER_ENV.items():
        os.environ.setdefault(name, value)
    settings = Settings()
    # The workers must run with WORKER_ENV (small segments, quick idle closes): a stack already up
    # keeps the settings it was started with, and would make every scenario wait on its idle closes.
    if mismatched := settings_the_running_stack_lacks(settings):
        print(f"a stack is running under {settings.state_dir} with other settings ({'; '.join(mismatched)}): "
              "stop it first (`epistream down`)", file=sys.stderr)
        return 2
    up(settings)
    url = admin_database_url(settings)
    run_id = f"{datetime.now(UTC):%m%dt%H%M%S}-{uuid.uuid4().hex[:4]}"
    size = workload.QUICK if (args.workload or ("quick" if args.quick else "full")) == "quick" else workload.FULL
    durations = QUICK_DURATIONS if args.quick else FULL_DURATIONS
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    results = []
    try:
        for scenario in chosen:
            results.append(run_scenario(settings, url, run_id, scenario, size, durations, settle.Limits()))
            # After each scenario: a run cut short still leaves the figures of the scenarios it finished.
            report.write(args.out, report.build(ROOT, {"quick": args.quick, "only": args.only, "run_id": run_id,
                                                       "partial": True}, results, None))
        hostile = None
        if not args.no_hostile and (not args.only or "hostile" in args.only):
            settle.wait_healthy(settings, timeout_s=600)
            hostile = run_hostile(settings, url, run_id)
    finally:
        settle.restore(settings)  # never leave a service paused or held down
    options = {"quick": args.quick, "only": args.only, "run_id": run_id, "size": size.__dict__,
               "durations": durations.__dict__}
    result = report.build(ROOT, options, results, hostile)
    report.write(args.out, result, final=True)
    bad = result["summary"]["lost"] or result["summary"]["duplicated"] or \
        result["summary"]["scenarios_with_failed_invariants"] or result["hostile"].get("failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
