"""``python -m bench.tracing_overhead [--turns N] [--reads M] [--rounds R] [--seed S] [--profile-s S]``: what tracing costs.

Ingest turns/s and `context` read latency (p50, p95) with tracing off and on, the read's both as its
caller times it and as the answer worker does (the reply's `latency_ms`). On the running stack's Kafka
and PostgreSQL (started if needed, no model server: neither ingest nor a `context` read calls a model).
Every phase has a database and topics of its own, dropped after it, and an ingest and an answer worker
of their own; its client side (the turns produced, then the reads one at a time on one long-lived
client) runs in a child process (``python -m bench.tracing_overhead client``), so with tracing on the
producer and the asker trace as an agent's process would, and with it off no process of the phase has
an OTEL_* variable. Traced processes export OTLP/HTTP to a receiver in a process of its own on loopback
(``python -m epistream.testing.otlp`` at --port + 2), which counts the spans of each service. Each round
runs an off and an on phase in an order drawn from --seed. With --profile-s, round 1's two phases end
with untimed reads while py-spy samples the answer worker. Writes bench/results/tracing-overhead.{json,png}."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import SecretStr

from epistream.client.session import EpistreamClient
from epistream.core import tracing
from epistream.infra.process import ManagedProcess, wait_until
from epistream.infra.stack import worker_argv
from epistream.messaging.topics import delete_topics, ensure_topics
from epistream.ops.readiness import port_open
from epistream.settings.processes import Settings, load_settings
from epistream.storage.db import admin_database_url, database_url, on_database
from epistream.testing.databases import drop_database, own_database

from . import py_spy, report
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
KINDS = ("off", "on")  # of phase: tracing off, tracing on
SEED = 20261205
WARM_UP = 2  # reads of each phase not counted: the worker's first reads load its model and pools
ASKER = "epistream-bench-client"  # the service name the phase's client process traces as
#: What the client process prints on stdout for the benchmark (other lines are its progress).
PROFILE_LINE, RESULT_PREFIX = "PROFILE", "RESULT "
#: The figures of a phase, as the summary, the table and the chart name them.
FIGURES = {"turns_per_s": "ingest turns/s", "context_p50_ms": "read p50, caller (ms)",
           "context_p95_ms": "read p95, caller (ms)", "worker_p50_ms": "read p50, worker (ms)",
           "worker_p95_ms": "read p95, worker (ms)"}


def _more_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=SEED, help=f"draws each round's order of phases (default {SEED})")
    p.add_argument("--profile-s", type=float, default=0.0,
                   help="seconds py-spy samples the answer worker at the end of round 1's two phases (default 0: none)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return report.run_args("python -m bench.tracing_overhead", __doc__, argv, turns=2000, reads=100, rounds=5, port=9160, results=RESULTS,
                           help_={"turns": "turns ingested per phase", "reads": "`context` reads per phase", "rounds": "rounds of an off and an on phase", "results": "where the JSON and PNG files go"},
                           more=_more_args)


def draw_order(rounds: int, seed: int) -> list[list[str]]:
    """Each round's order of its off and on phases, drawn: neither setting always runs second, on a
    machine the first has warmed (or loaded)."""
    rng = random.Random(seed)
    return [rng.sample(KINDS, len(KINDS)) for _ in range(rounds)]


def _env(value: object) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


@contextmanager
def deployment(stack: Settings, run_id: str, *, prefix: str = "tracing") -> Iterator[tuple[Settings, dict[str, str]]]:
    """The run's topics and database on the stack's Kafka and PostgreSQL, both dropped after; its settings
    and the environment its workers get (no OTEL_* variable of the caller's: each phase says whether it traces)."""
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
        try:
            asyncio.run(delete_topics(stack, [overrides[f"topic_{t}"] for t in TOPICS]))
        except Exception as exc:  # litter on Kafka, not a reason to lose the figures measured
            print(f"  the topics {prefix}-{run_id}.* are left on Kafka: {exc!r}", flush=True)


@contextmanager
def workers(settings: Settings, env: dict[str, str], port: int, name: str) -> Iterator[dict[str, ManagedProcess]]:
    """An ingest and an answer worker with `env`, ready (their /metrics answer) for the block; by kind."""
    started: dict[str, ManagedProcess] = {}
    try:
        for n, worker in enumerate(("ingest", "answer")):
            process = ManagedProcess(f"worker-{worker}-{name}", settings.state_dir)
            process.spawn(worker_argv(worker), env=env | {PORT_OF[worker]: str(port + n)})
            started[worker] = process
            wait_until(lambda p=port + n: port_open("127.0.0.1", p), timeout=120, what=f"{worker} worker",
                       log_file=process.log_file)
        yield started
    finally:
        for process in started.values():
            process.stop()


@contextmanager
def receiver(stack: Settings, port: int, name: str) -> Iterator[str]:
    """An OTLP/HTTP receiver in a process of its own on `port` (its decoding takes no time from the
    processes timed); its endpoint, for OTEL_EXPORTER_OTLP_ENDPOINT."""
    if port_open("127.0.0.1", port):
        raise RuntimeError(f"port {port} is taken: the receiver needs it (--port + 2)")
    process = ManagedProcess(f"otlp-receiver-{name}", stack.state_dir)
    process.spawn([sys.executable, "-m", "epistream.testing.otlp", "--port", str(port)], cwd=ROOT)
    try:
        wait_until(lambda: port_open("127.0.0.1", port), timeout=30, what="OTLP receiver", log_file=process.log_file)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def received(endpoint: str) -> dict[str, int]:
    """The spans the receiver has counted so far, by service."""
    with urllib.request.urlopen(f"{endpoint}/v1/stats", timeout=10) as response:
        return dict(json.load(response)["services"])


# ---- a phase's client side, in a process of its own ----------------------------------------------------


def client_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.tracing_overhead client",
                                description="A phase's client side: produce the turns, wait for them, then time "
                                            "the reads; settings and OTEL_* from the environment.")
    p.add_argument("--tenant", required=True)
    p.add_argument("--turns", type=int, required=True)
    p.add_argument("--reads", type=int, required=True)
    p.add_argument("--profile-s", type=float, default=0.0, help="untimed reads for this long after the timed ones")
    return p.parse_args(argv)


async def client_side(settings: Settings, *, tenant: str, turns: int, reads: int, profile_s: float) -> dict[str, Any]:
    """`turns` turns produced at once and waited for in the table, then `reads` context reads one after
    another on one client (WARM_UP more first), each timed here and by the worker; with `profile_s`, reads
    go on untimed for that long (and a second more) after a PROFILE line, while the benchmark samples."""
    records = [(t.conversation_id.encode(), t.to_bytes()) for t in synthetic_turns(tenant, turns)]
    async with EpistreamClient(settings) as client:
        started = time.perf_counter()
        await client.produce_raw(records)
        done = await asyncio.to_thread(wait_for_rows, admin_database_url(settings), tenant, turns)
        caller_ms, worker_ms = [], []
        for n in range(WARM_UP + reads):
            asked = time.perf_counter()
            reply = await client.context(tenant=tenant, question=QUESTIONS[n % len(QUESTIONS)], timeout_s=60)
            took = time.perf_counter() - asked
            if reply.error:
                raise RuntimeError(f"a read failed: {reply.error}")
            if n >= WARM_UP:
                caller_ms.append(round(took * 1000, 2))
                worker_ms.append(round(reply.latency_ms, 2))
        profiled = 0
        if profile_s > 0:
            print(PROFILE_LINE, flush=True)
            until = time.perf_counter() + profile_s + 1
            while time.perf_counter() < until:
                await client.context(tenant=tenant, question=QUESTIONS[profiled % len(QUESTIONS)], timeout_s=60)
                profiled += 1
    return {"ingest_s": done - started, "caller_ms": caller_ms, "worker_ms": worker_ms, "profile_reads": profiled}


def client_main(argv: list[str]) -> int:
    args = client_args(argv)
    settings = load_settings()  # the phase's topics and database, from the environment the benchmark gives
    tracing.setup(ASKER)  # on where OTEL_* asks for it, as the CLI's client verbs do
    try:
        result = asyncio.run(client_side(settings, tenant=args.tenant, turns=args.turns, reads=args.reads,
                                         profile_s=args.profile_s))
    finally:
        tracing.shutdown()  # the last spans exported before the benchmark counts them
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


def run_client(env: dict[str, str], *, tenant: str, turns: int, reads: int, profile_s: float,
               answer_pid: int | None) -> dict[str, Any]:
    """The phase's client process, to its end; with `profile_s`, the answer worker sampled by py-spy while
    the client's untimed reads run."""
    argv = [sys.executable, "-m", "bench.tracing_overhead", "client", "--tenant", tenant, "--turns", str(turns),
            "--reads", str(reads), "--profile-s", str(profile_s)]
    result: dict[str, Any] | None = None
    sampling: Future[dict[str, float] | None] | None = None
    with ThreadPoolExecutor(1) as pool, subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(RESULT_PREFIX):
                result = json.loads(line[len(RESULT_PREFIX):])
            elif line.strip() == PROFILE_LINE:
                if answer_pid is not None:
                    sampling = pool.submit(py_spy.profile, answer_pid, profile_s)
            else:
                print("  " + line, end="", flush=True)
    if child.returncode != 0 or result is None:
        raise RuntimeError(f"the phase's client process failed (exit status {child.returncode})")
    if sampling is not None:
        result["profile"] = {"seconds": profile_s, "reads": result["profile_reads"], "answer_worker": sampling.result()}
    return result


def _ms(values: list[float]) -> tuple[float, float]:
    p50, p95 = np.percentile(np.array(values), [50, 95])
    return round(float(p50), 1), round(float(p95), 1)


def phase(settings: Settings, env: dict[str, str], *, traced_to: str | None, counted_by: str, tenant: str,
          turns: int, reads: int, port: int, profile_s: float = 0.0) -> dict[str, Any]:
    """One phase on workers of its own: the client process's turns and reads, and the spans the receiver
    (`counted_by`) got from the phase's processes, by service. Tracing is on where `traced_to` names the
    receiver's endpoint: then the client and the answer worker must have sent spans; with it off, nobody."""
    otel = {} if traced_to is None else {"OTEL_EXPORTER_OTLP_ENDPOINT": traced_to}
    before = received(counted_by)
    with workers(settings, env | otel, port, tenant) as started:
        client = run_client(env | otel, tenant=tenant, turns=turns, reads=reads, profile_s=profile_s,
                            answer_pid=started["answer"].pid())
    after = received(counted_by)  # the workers flush their spans as they stop
    spans = {service: n - before.get(service, 0) for service, n in after.items() if n > before.get(service, 0)}
    if traced_to is not None and not (spans.get(ASKER) and spans.get("epistream-answer")):
        raise RuntimeError(f"tracing on, but the asker or the answer worker sent no span: {spans}")
    if traced_to is None and spans:
        raise RuntimeError(f"tracing off, but spans came: {spans}")
    caller_p50, caller_p95 = _ms(client["caller_ms"])
    worker_p50, worker_p95 = _ms(client["worker_ms"])
    figures = {"tracing": traced_to is not None, "turns": turns, "ingest_s": round(client["ingest_s"], 3),
               "turns_per_s": round(turns / client["ingest_s"], 2), "reads": reads,
               "context_p50_ms": caller_p50, "context_p95_ms": caller_p95,
               "worker_p50_ms": worker_p50, "worker_p95_ms": worker_p95,
               "spans": sum(spans.values()), "spans_by_service": spans}
    if "profile" in client:
        figures["profile"] = client["profile"]
    return figures


# ---- the figures ---------------------------------------------------------------------------------------------


def summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over the phases of each setting and on against off, and, where the phases
    name their round, each round's on / off (its two phases ran back to back, spared the drift between
    rounds). A figure some phase lacks (an older run's) is left out."""
    def median(tracing_: bool, key: str) -> float:
        return float(np.median([p[key] for p in phases if p["tracing"] is tracing_]))

    rounds = sorted({p["round"] for p in phases if "round" in p})
    out: dict[str, Any] = {}
    for key in FIGURES:
        if not all(key in p for p in phases):
            continue
        off, on = median(False, key), median(True, key)
        out[key] = {"off": round(off, 2), "on": round(on, 2), "on_over_off": round(on / off, 3) if off else None}
        ratios = []
        for r in rounds:
            pair = {p["tracing"]: p[key] for p in phases if p.get("round") == r}
            if pair.get(False) and True in pair:
                ratios.append(round(pair[True] / pair[False], 3))
        if ratios:
            out[key]["rounds_on_over_off"] = ratios
    return out


def profiles(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer worker's py-spy buckets in the profiled phases, by setting."""
    return {("on" if p["tracing"] else "off"): p["profile"]["answer_worker"] for p in phases if "profile" in p}


def plot(result: dict[str, Any], path: Path) -> None:
    s = result["summary"]
    fig, (left, right) = report.subplots(1, 2, figsize=(10, 3.8))
    report.bars(left, ["off", "on"], [s["turns_per_s"]["off"], s["turns_per_s"]["on"]], ["#888", "#3a7"],
                label="{:.0f}")
    left.set_title("ingest turns/s (median of phases)")
    keys = [k for k in FIGURES if k != "turns_per_s" and k in s]
    report.grouped_bars(right, len(keys), [("tracing off", [s[k]["off"] for k in keys], "#888"),
                                           ("tracing on", [s[k]["on"] for k in keys], "#3a7")])
    right.set_xticks(range(len(keys)), [FIGURES[k].replace("read ", "").replace(" (ms)", "") for k in keys])
    right.set_title("context read latency (ms, median of phases)")
    right.legend()
    report.save(fig, path)


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]

    def by_round(figures: dict[str, Any]) -> str:
        ratios = figures.get("rounds_on_over_off")
        return f"{min(ratios):.2f} to {max(ratios):.2f}" if ratios else ""

    text = report.table(["", "tracing off", "tracing on", "on / off", "on / off, rounds"],
                        ([label, s[key]["off"], s[key]["on"], s[key]["on_over_off"], by_round(s[key])]
                         for key, label in FIGURES.items() if key in s))
    for setting, shares in (result.get("profile") or {}).items():
        if shares:
            text += (f"\n\nanswer worker, tracing {setting}: {shares.get('tracing', 0.0):.1%} of py-spy's busy samples "
                     f"in tracing ({', '.join(f'{name} {share:.0%}' for name, share in list(shares.items())[:4])})")
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    args = parse_args(argv)
    stack = Settings()
    # Any running stack will do, the test suite's included: the run keeps to databases and topics of its own.
    up(stack, only={"kafka", "postgres"})
    run_id = uuid.uuid4().hex[:8]
    order = draw_order(args.rounds, args.seed)
    phases = []
    with receiver(stack, args.port + 2, run_id) as endpoint:
        for n, kinds in enumerate(order):
            for setting in kinds:
                traced = setting == "on"
                profile_s = args.profile_s if n == 0 else 0.0
                print(f"round {n + 1}/{args.rounds}, tracing {setting}: {args.turns} turns, {args.reads} context reads"
                      + (f", then {profile_s:g} s profiled" if profile_s else ""), flush=True)
                tenant = f"bench-{run_id}-{n + 1}-{setting}"
                # A database and topics of the phase's own: none reads what another phase grew.
                with deployment(stack, f"{run_id}_{n + 1}_{setting}") as (settings, env):
                    figures = phase(settings, env, traced_to=endpoint if traced else None, counted_by=endpoint,
                                    tenant=tenant, turns=args.turns, reads=args.reads, port=args.port,
                                    profile_s=profile_s)
                figures["round"] = n + 1
                print(f"  {figures}", flush=True)
                phases.append(figures)
    result = {"machine": report.machine_info(ROOT), "turns": args.turns, "reads": args.reads, "rounds": args.rounds,
              "seed": args.seed, "order": order, "profile_s": args.profile_s, "phases": phases,
              "summary": summary(phases), "profile": profiles(phases)}
    report.write_results(args.results / JSON_NAME, result, plot, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
