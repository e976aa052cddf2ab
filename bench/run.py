"""``python -m bench.run [--only ingest|enrich] [--quick] [--keep] ...``: the benchmarks, ingest then enrichment.

Starts the embedded stack if needed (and leaves it running). Ingest measures,
on the same texts, end-to-end ingest, the embedding model alone and a plain
COPY; enrichment streams LoCoMo at a steady rate and measures segments,
gists, facts, model calls and latencies against direct calls to the model
server. Writes bench/results/{ingest,enrich}.{json,png} and prints markdown.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url

from .enrich import EnrichOptions, run_enrich
from .ingest_phase import QUICK_TURNS, run_ingest
from .stack import restart_ingest_worker, up, worker_setting

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# Quick enrichment: two conversations, 200 turns, 11 segments. Each segment costs the CPU model
# 0.5-3 minutes (up to three calls of up to 1024 tokens), so ~400 turns would take most of an hour.
QUICK_CONVERSATIONS = 2
QUICK_TURNS_PER_CONVERSATION = 100
IDLE_ENV = "EPISTREAM_SEGMENT_IDLE_S"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("ingest", "enrich"), help="run one part only (default: ingest, then enrich)")
    p.add_argument("--quick", action="store_true",
                   help=f"small runs: {QUICK_TURNS} ingest turns; enrichment of {QUICK_CONVERSATIONS} conversations "
                   f"x {QUICK_TURNS_PER_CONVERSATION} turns")
    p.add_argument("--keep", action="store_true", help="keep the benchmark's rows (default: forget its tenants)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the JSON and PNG files go")
    ingest = p.add_argument_group("ingest")
    ingest.add_argument("--turns", type=int, help="cap the number of turns (default: the whole LoCoMo dev split)")
    ingest.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of ingest then the embedder alone (default 3; the median round's "
                        "figures are reported, with the spread)")
    enrich = p.add_argument_group("enrichment")
    enrich.add_argument("--rate", type=float, default=20.0, help="turns per second streamed (default 20)")
    enrich.add_argument("--conversations", type=int, help="first N conversations (default: all, or 2 with --quick)")
    enrich.add_argument("--turns-per-conversation", type=int, help="first N turns of each (default: all)")
    enrich.add_argument("--idle-s", type=float, default=20.0,
                        help=f"{IDLE_ENV} for workers this run starts (default 20; an exported value wins)")
    enrich.add_argument("--restart-worker", action="store_true",
                        help="restart a running ingest worker whose idle timeout differs from the one asked for")
    enrich.add_argument("--max-minutes", type=float, default=75.0,
                        help="stop waiting after this long and report partial figures (default 75)")
    enrich.add_argument("--stall-minutes", type=float, default=15.0,
                        help="stop when nothing progresses for this long (default 15)")
    args = p.parse_args(argv)
    if args.turns is not None and args.turns < 1:
        p.error("--turns must be at least 1")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.rate <= 0:
        p.error("--rate must be positive")
    return args


def _interrupt_on_sigterm() -> None:
    """`kill <pid>` stops a long run like Ctrl-C: partial figures are written and the rows removed.
    A second SIGTERM is ignored, so it cannot cut that clean-up short (SIGKILL still can)."""

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, lambda *_: print("  (SIGTERM again: already stopping)", flush=True))
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def start_stack(args: argparse.Namespace) -> Settings:
    # The workers inherit up()'s environment: a short idle timeout closes each conversation's last
    # segment soon after its last turn, instead of 300 s later.
    os.environ.setdefault(IDLE_ENV, f"{args.idle_s:g}")
    settings = Settings()
    if settings.state_dir == (ROOT / ".epistream-test").resolve():
        sys.exit("EPISTREAM_HOME points at the test suite's stack; unset it (the benchmark uses .epistream)")
    print(f"{IDLE_ENV}={os.environ[IDLE_ENV]}")
    up(settings)
    running = worker_setting(settings, "segment_idle_s")
    if running is not None and float(running) != float(os.environ[IDLE_ENV]):
        if args.restart_worker:
            print(f"  restarting the ingest worker (its idle timeout is {running}s)")
            print(f"  up   worker-ingest   pid {restart_ingest_worker(settings)}")
        else:
            print(f"  note: the running ingest worker closes idle conversations after {running}s, not "
                  f"{os.environ[IDLE_ENV]}s; --restart-worker restarts it")
    return settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _interrupt_on_sigterm()
    settings = start_stack(args)
    url = admin_database_url(settings)
    run_id = f"{datetime.now(UTC):%Y%m%dt%H%M%S}-{uuid.uuid4().hex[:6]}"
    if args.only in (None, "ingest"):
        run_ingest(settings, url, run_id, args)
    if args.only in (None, "enrich"):
        quick = args.quick
        opts = EnrichOptions(
            rate=args.rate,
            conversations=args.conversations or (QUICK_CONVERSATIONS if quick else None),
            turns_per_conversation=args.turns_per_conversation or (QUICK_TURNS_PER_CONVERSATION if quick else None),
            max_minutes=args.max_minutes, stall_minutes=args.stall_minutes, keep=args.keep, quick=quick,
            results=args.results,
        )
        run_enrich(settings, url, run_id, opts)
    print("\nThe stack is left running; `epistream down` (or `make down`) stops it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
