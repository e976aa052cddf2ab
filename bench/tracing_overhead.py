"""``python -m bench.tracing_overhead [--turns N] [--reads M] [--rounds R]``: what tracing costs.

Ingest turns/s and `context` read latency (p50, p95) with tracing off and on, in the same run: on
the running stack's Kafka and PostgreSQL (started if needed, no model server: neither ingest nor a
`context` read calls a model), a database and topics of the run's own, and an ingest and an answer
worker of their own, started afresh for each phase; with tracing on they export OTLP/HTTP to a real
receiver on loopback (epistream.testing.otlp). Phases alternate (off, on, off, on, ...) so a drift
of the machine's load falls on both. Writes bench/results/tracing-overhead.{json,png}."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import SecretStr

from epistream.client.api import context, produce_raw
from epistream.infra.process import ManagedProcess, wait_until
from epistream.infra.stack import worker_argv
from epistream.messaging.topics import ensure_topics
from epistream.ops.readiness import port_open
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url, database_url, on_database
from epistream.testing.databases import drop_database, own_database
from epistream.testing.otlp import OtlpReceiver

from . import report
from .ingest import wait_for_rows
from .stack import up
from .workload import synthetic_turns

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
JSON_NAME = "tracing-overhead.json"
TOPICS = ("turns", "segments", "questions", "answers", "dlq", "forgotten")
PORT_OF = {"ingest": "EPISTREAM_INGEST_METRICS_PORT", "answer": "EPISTREAM_ANSWER_METRICS_PORT"}
QUESTIONS = ("What did Alex say about the weekend?", "Which plans did Sam mention?", "What happened at work?",
             "Who talked about cooking dinner?", "What was said about the trip?")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return report.run_args("python -m bench.tracing_overhead", __doc__, argv, turns=2000, reads=100, rounds=2, port=9160, results=RESULTS,
                           help_={"turns": "turns ingested per phase", "reads": "`context` reads per phase", "rounds": "off/on pairs of phases", "results": "where the JSON and PNG files go"})


def _env(value: object) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


@contextmanager
def deployment(stack: Settings, run_id: str, *, prefix: str = "tracing") -> Iterator[tuple[Settings, dict[str, str]]]:
    """The run's topics and database on the stack's Kafka and PostgreSQL; its settings and the environment
    its workers get (no OTEL_* variable of the caller's: each phase says whether it traces)."""
    overrides: dict[str, Any] = {f"topic_{t}": f"{prefix}-{run_id}.{t}" for t in TOPICS} | {
        "indexer_group": f"{prefix}-{run_id}", "answer_group": f"{prefix}-{run_id}-answer"}
    name = f"{prefix}_{run_id}"
    settings = on_database(stack.with_overrides(**overrides), own_database(stack, name))
    try:
        asyncio.run(ensure_topics(settings))
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env |= {f"EPISTREAM_{k.upper()}": _env(v) for k, v in overrides.items()} | {
            "EPISTREAM_DATABASE_URL": database_url(settings),
            "EPISTREAM_DATABASE_ADMIN_URL": admin_database_url(settings)}
        yield settings, env
    finally:
        drop_database(stack, name)


@contextmanager
def workers(settings: Settings, env: dict[str, str], port: int, name: str) -> Iterator[None]:
    """An ingest and an answer worker with `env`, ready (their /metrics answer) for the block."""
    started: list[ManagedProcess] = []
    try:
        for n, worker in enumerate(("ingest", "answer")):
            process = ManagedProcess(f"worker-{worker}-{name}", settings.state_dir)
            process.spawn(worker_argv(worker), env=env | {PORT_OF[worker]: str(port + n)})
            started.append(process)
            wait_until(lambda p=port + n: port_open("127.0.0.1", p), timeout=120, what=f"{worker} worker",
                       log_file=process.log_file)
        yield
    finally:
        for process in started:
            process.stop()


def phase(settings: Settings, env: dict[str, str], *, traced: OtlpReceiver | None, tenant: str, turns: int,
          reads: int, port: int) -> dict[str, Any]:
    """One phase: `turns` turns produced at once and waited for in the table, then `reads` context reads
    one after another (the first two warm up and are not counted)."""
    otel = {} if traced is None else {"OTEL_EXPORTER_OTLP_ENDPOINT": traced.endpoint}
    records = [(t.conversation_id.encode(), t.to_bytes()) for t in synthetic_turns(tenant, turns)]
    spans_before = len(traced.received()) if traced is not None else 0
    with workers(settings, env | otel, port, tenant):
        started = time.perf_counter()
        asyncio.run(produce_raw(settings, records))
        done = wait_for_rows(admin_database_url(settings), tenant, turns)
        latencies = []
        for n in range(reads + 2):
            asked = time.perf_counter()
            asyncio.run(context(settings, tenant=tenant, question=QUESTIONS[n % len(QUESTIONS)], timeout_s=60))
            latencies.append(time.perf_counter() - asked)
        time.sleep(1.0)  # the last spans leave within the exporter's batch delay
    measured = np.array(latencies[2:])
    p50, p95 = np.percentile(measured, [50, 95])
    return {"tracing": traced is not None, "turns": turns, "ingest_s": round(done - started, 3),
            "turns_per_s": round(turns / (done - started), 2), "reads": reads,
            "context_p50_ms": round(float(p50) * 1000, 1), "context_p95_ms": round(float(p95) * 1000, 1),
            "spans": (len(traced.received()) - spans_before) if traced is not None else 0}


def summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the phases of each kind, and on against off."""
    def median(tracing: bool, key: str) -> float:
        return float(np.median([p[key] for p in phases if p["tracing"] is tracing]))

    out: dict[str, Any] = {}
    for key in ("turns_per_s", "context_p50_ms", "context_p95_ms"):
        off, on = median(False, key), median(True, key)
        out[key] = {"off": round(off, 2), "on": round(on, 2), "on_over_off": round(on / off, 3) if off else None}
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    s = result["summary"]
    fig, (left, right) = report.subplots(1, 2, figsize=(9, 3.6))
    report.bars(left, ["off", "on"], [s["turns_per_s"]["off"], s["turns_per_s"]["on"]], ["#888", "#3a7"])
    left.set_title("ingest turns/s (median of phases)")
    report.bars(right, ["p50 off", "p50 on", "p95 off", "p95 on"],
                [s["context_p50_ms"]["off"], s["context_p50_ms"]["on"], s["context_p95_ms"]["off"],
                 s["context_p95_ms"]["on"]], ["#888", "#3a7", "#888", "#3a7"])
    right.set_title("context read latency (ms)")
    report.save(fig, path)


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    labels = {"turns_per_s": "ingest turns/s", "context_p50_ms": "context p50 (ms)",
              "context_p95_ms": "context p95 (ms)"}
    return report.table(["", "tracing off", "tracing on", "on / off"],
                        ([label, s[key]["off"], s[key]["on"], s[key]["on_over_off"]] for key, label in labels.items()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stack = Settings()
    # Any running stack will do, the test suite's included: the run keeps to a database and topics of its own.
    up(stack, only={"kafka", "postgres"})
    run_id = uuid.uuid4().hex[:8]
    phases = []
    with deployment(stack, run_id) as (settings, env), OtlpReceiver() as receiver:
        for n in range(args.rounds):
            for traced in (False, True):
                tenant = f"bench-{run_id}-{n}-{'on' if traced else 'off'}"
                print(f"round {n + 1}/{args.rounds}, tracing {'on' if traced else 'off'}: {args.turns} turns, "
                      f"{args.reads} context reads", flush=True)
                figures = phase(settings, env, traced=receiver if traced else None, tenant=tenant,
                                turns=args.turns, reads=args.reads, port=args.port)
                print(f"  {figures}", flush=True)
                phases.append(figures)
    result = {"machine": report.machine_info(ROOT), "turns": args.turns, "reads": args.reads, "rounds": args.rounds,
              "phases": phases, "summary": summary(phases)}
    report.write_results(args.results / JSON_NAME, result, plot, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
