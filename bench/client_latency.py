"""``python -m bench.client_latency [--turns N] [--reads M] [--rounds R]``: what a `context` read costs the
caller, and which Kafka latency settings the long-lived client uses.

On the running stack's Kafka and PostgreSQL (started if needed, no model server: a `context` read calls
no model), with a database and topics of the run's own and an ingest and an answer worker of their own:
`--turns` turns are stored, then each variant reads `--reads` times idle (one read at a time) and 8 at a
time (8 callers, `--reads` reads each), each as the caller sees it and as its path outside the worker's
read (the caller's latency less the reply's `latency_ms`): a one-shot call per read (`epistream.context`, Kafka clients
started for each call), and one `EpistreamClient` per variant with its producer's `linger_ms` and its
reply consumer's `fetch_max_wait_ms`. Variants alternate round by round, so a drift of the machine's load
falls on all. Writes bench/results/client-latency.json."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from epistream.client.api import context, produce_raw
from epistream.client.session import EpistreamClient
from epistream.contracts.replies import MemoryContext
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url

from . import report
from .ingest import wait_for_rows
from .stack import up
from .tracing_overhead import QUESTIONS, deployment, workers
from .workload import synthetic_turns

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
JSON_NAME = "client-latency.json"
CONCURRENCY = 8
#: (name, linger_ms, fetch_max_wait_ms); None: the one-shot call.
VARIANTS: list[tuple[str, int | None, int | None]] = [
    ("one-shot call", None, None),
    ("client linger 5, fetch wait 500", 5, 500),  # the project's producer default, aiokafka's fetch default
    ("client linger 5, fetch wait 100", 5, 100),
    ("client linger 0, fetch wait 100", 0, 100),
    ("client linger 0, fetch wait 10", 0, 10),
]

Read = Callable[[int], Awaitable[MemoryContext]]
LOADS = ("idle", "idle path", "concurrent", "concurrent path")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return report.run_args("python -m bench.client_latency", __doc__, argv, turns=500, reads=40, rounds=2, port=9170, results=RESULTS,
                           help_={"turns": "turns stored before the reads", "reads": "reads per variant and round, idle and per caller", "rounds": "rounds over the variants", "results": "where the JSON file goes"})


async def _timed(read: Read, n: int, into: list[float], path: list[float]) -> None:
    """A read's latency as the caller sees it, and its path outside the worker's read (the caller's latency
    less the reply's own `latency_ms`: Kafka both ways, the worker's fetch and its transaction)."""
    started = time.perf_counter()
    reply = await read(n)
    into.append(time.perf_counter() - started)
    path.append(into[-1] - reply.latency_ms / 1000)
    if reply.error:
        raise RuntimeError(f"a read failed: {reply.error}")


async def _measure(read: Read, reads: int) -> dict[str, list[float]]:
    """`reads` reads one at a time, then `reads` per caller with CONCURRENCY callers (two warm-up reads first)."""
    for n in range(2):
        await read(n)
    out: dict[str, list[float]] = {load: [] for load in LOADS}
    for n in range(reads):
        await _timed(read, n, out["idle"], out["idle path"])

    async def caller(c: int) -> None:
        for n in range(reads):
            await _timed(read, c * reads + n, out["concurrent"], out["concurrent path"])

    await asyncio.gather(*(caller(c) for c in range(CONCURRENCY)))
    return out


async def _variant(settings: Settings, tenant: str, linger_ms: int | None, fetch_wait_ms: int | None,
                   reads: int) -> dict[str, list[float]]:
    def ask(on: Callable[..., Awaitable[MemoryContext]]) -> Read:
        return lambda n: on(tenant=tenant, question=QUESTIONS[n % len(QUESTIONS)], timeout_s=60)

    if linger_ms is None or fetch_wait_ms is None:
        return await _measure(ask(lambda **kw: context(settings, **kw)), reads)
    async with EpistreamClient(settings, linger_ms=linger_ms, fetch_max_wait_ms=fetch_wait_ms) as client:
        return await _measure(ask(client.context), reads)


def _ms(values: list[float]) -> dict[str, float]:
    p50, p95 = np.percentile(np.array(values), [50, 95])
    return {"p50_ms": round(float(p50) * 1000, 1), "p95_ms": round(float(p95) * 1000, 1), "n": len(values)}


def markdown(result: dict[str, Any]) -> str:
    """p50 / p95 in ms of each variant: as the caller sees a read, and its path outside the worker's read."""
    def cell(figures: dict[str, float]) -> str:
        return f"{figures['p50_ms']:.0f} / {figures['p95_ms']:.0f}"

    return report.table(["variant", "idle", "idle, path", f"{CONCURRENCY} at a time", f"{CONCURRENCY} at a time, path"],
                        ([name] + [cell(s[load]) for load in LOADS] for name, s in result["summary"].items()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stack = Settings()
    # Any running stack will do, the test suite's included: the run keeps to a database and topics of its own.
    up(stack, only={"kafka", "postgres"})
    run_id = uuid.uuid4().hex[:8]
    tenant = f"bench-{run_id}"
    samples: dict[str, dict[str, list[float]]] = {name: {load: [] for load in LOADS} for name, _, _ in VARIANTS}
    with deployment(stack, run_id, prefix="client") as (settings, env), workers(settings, env, args.port, run_id):
        records = [(t.conversation_id.encode(), t.to_bytes()) for t in synthetic_turns(tenant, args.turns)]
        asyncio.run(produce_raw(settings, records))
        wait_for_rows(admin_database_url(settings), tenant, args.turns)
        for n in range(args.rounds):
            for name, linger_ms, fetch_wait_ms in VARIANTS:
                print(f"round {n + 1}/{args.rounds}: {name}", flush=True)
                measured = asyncio.run(_variant(settings, tenant, linger_ms, fetch_wait_ms, args.reads))
                for load, values in measured.items():
                    samples[name][load] += values
                print("  " + ", ".join(f"{load} {_ms(values)}" for load, values in measured.items()), flush=True)
    result = {"machine": report.machine_info(ROOT), "turns": args.turns, "reads": args.reads, "rounds": args.rounds,
              "concurrency": CONCURRENCY,
              "summary": {name: {load: _ms(values) for load, values in by_load.items()}
                          for name, by_load in samples.items()}}
    report.write_results(args.results / JSON_NAME, result, markdown=markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
