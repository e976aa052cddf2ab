"""python -m bench.reads: a `context` read's latency where the caller meets it, on the embedded stack.

The same reads (the demo conversation's questions, budget 1,000 tokens, tenant `demo`) measured:

  in_process.concurrent_N  the read itself (consumers.context.read_context: its pool and embedder), N at
                           a time, without Kafka: this machine's capacity for reads
  caller.idle              one read at a time through Kafka, a pause between reads (one EpistreamClient)
  caller.concurrent_N      N callers at once, back to back, sharing one EpistreamClient
  caller.under_load        4 callers while 2 `deep` questions run on the embedded model and ingest takes
                           50 turns/s
  mcp.concurrent_8         `recall` through `epistream mcp --transport http` (the mcp SDK's client, one
                           session per caller)

Each entry is {"p50_ms", "p95_ms", "reads_per_s"} at the caller, with the worker's own latency (the
replies' `latency_ms`) beside it where the reply carries it: the difference is the Kafka path.
Run it alone (no other stack or model beside it on the cores); the load average is recorded.
Writes bench/results/reads.json and reads.png (p95 against concurrency); docs/benchmarks/reads.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from bench import py_spy, report
from bench.stack import CpuSnapshot, cpu_report, managed_pid, up, wait_until_idle
from bench.worker_metrics import scrape_samples
from epistream.apps.cli.demo import asked_at_for, sample_questions, sample_turns, wait_until_stored
from epistream.client.api import produce_turns
from epistream.client.session import EpistreamClient
from epistream.consumers.assistants import AssistantPool
from epistream.consumers.context import read_context
from epistream.consumers.deps import AnswerDeps
from epistream.consumers.retrieval import from_settings
from epistream.contracts.questions import Mode, Question
from epistream.contracts.turns import Turn
from epistream.core.metrics import sample_sum
from epistream.ops.resources import Resources
from epistream.settings.processes import Settings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "reads.json"
BUDGET = 1_000
TENANT = "demo"


@dataclass
class Timings:
    """Latencies at the caller (and in the worker, where the reply says), and the phase's wall time."""

    caller_s: list[float] = field(default_factory=list)
    worker_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_ms_per_read: dict[str, float] | None = None  # by process, where counted

    def summary(self) -> dict[str, float | int]:
        ms = np.array(self.caller_s) * 1000
        out: dict[str, float | int] = {"p50_ms": round(float(np.percentile(ms, 50)), 1),
                                       "p95_ms": round(float(np.percentile(ms, 95)), 1),
                                       "reads_per_s": round(len(ms) / self.wall_s, 1), "reads": len(ms)}
        if self.cpu_ms_per_read is not None:
            out["cpu_ms_per_read"] = self.cpu_ms_per_read  # type: ignore[assignment]
        if self.worker_ms:
            out |= {"worker_p50_ms": round(float(np.percentile(self.worker_ms, 50)), 1),
                    "worker_p95_ms": round(float(np.percentile(self.worker_ms, 95)), 1)}
        return out


#: The answer worker's own time per question, from its /metrics (sum and count of each histogram).
PROFILE = {"slot_wait_read": ("epistream_answer_slot_wait_seconds", {"lane": "read"}),
           "context_read": ("epistream_context_read_duration_seconds", {}),
           "publish_transaction": ("epistream_answer_publish_seconds", {})}


def _profile_totals(settings: Settings) -> dict[str, tuple[float, float]] | None:
    samples = scrape_samples(settings, "answer")
    if samples is None:
        return None
    return {key: (sample_sum(samples, f"{name}_sum", **labels), sample_sum(samples, f"{name}_count", **labels))
            for key, (name, labels) in PROFILE.items()}


def worker_profile(before: dict[str, tuple[float, float]] | None,
                   after: dict[str, tuple[float, float]] | None) -> dict[str, float]:
    """Mean milliseconds per question of each step of the answer worker between two scrapes, and how
    many transactions carried the replies (fewer than the reads: replies ready together share one)."""
    if before is None or after is None:
        return {}
    out = {}
    for key in PROFILE:
        total, count = (a - b for a, b in zip(after[key], before[key], strict=True))
        out[f"{key}_mean_ms"] = round(1000 * total / count, 2) if count else 0.0
    out["transactions"] = after["publish_transaction"][1] - before["publish_transaction"][1]
    return out


Read = Callable[[str], Awaitable[float | None]]  # one read of a question; the worker's latency_ms if known


async def _reads(read: Read, questions: list[str], left: Iterator[int], timings: Timings, *, offset: int,
                 pause_s: float = 0.0) -> None:
    """One caller: reads back to back (after `pause_s` each) while `left` has reads to do."""
    for i in left:
        started = time.perf_counter()
        worker_ms = await read(questions[(i + offset) % len(questions)])
        timings.caller_s.append(time.perf_counter() - started)
        if worker_ms is not None:
            timings.worker_ms.append(worker_ms)
        if pause_s:
            await asyncio.sleep(pause_s)


async def closed_loop(read: Read, questions: list[str], *, callers: int, reads: int, pause_s: float = 0.0) -> Timings:
    """`callers` callers reading back to back (after `pause_s` each) until `reads` reads are done."""
    timings, left = Timings(), iter(range(reads))
    started = time.perf_counter()
    await asyncio.gather(*(_reads(read, questions, left, timings, offset=n, pause_s=pause_s) for n in range(callers)))
    timings.wall_s = time.perf_counter() - started
    return timings


def _question(text: str, asked_at: datetime) -> Question:
    return Question(question_id=f"b-{uuid.uuid4()}", tenant=TENANT, question=text, mode=Mode.CONTEXT,
                    budget_tokens=BUDGET, asked_at=asked_at)


async def in_process(settings: Settings, questions: list[str], asked_at: datetime, *, callers: int,
                     reads: int) -> Timings:
    """The read itself, as the answer worker runs it, without Kafka."""
    shared = await Resources.open(settings)
    try:
        deps = AnswerDeps(settings=settings, pool=shared.pool, read_pool=shared.read_pool, embedder=shared.embedder,
                          master=shared.model("master"),
                          metrics=shared.metrics, assistants=AssistantPool(shared.assistants(), concurrency=1, max_tokens=1),
                          recipes=from_settings(settings))

        async def read(text: str) -> float | None:
            await read_context(_question(text, asked_at), deps)
            return None

        await closed_loop(read, questions, callers=callers, reads=min(reads, 20))  # warm: pool, caches
        before = CpuSnapshot.take()
        timings = await closed_loop(read, questions, callers=callers, reads=reads)
        timings.cpu_ms_per_read = cpu_per_read(settings, before, reads)  # before the pool's backends exit
        return timings
    finally:
        await shared.close()


def client_read(client: EpistreamClient, asked_at: datetime) -> Read:
    async def read(text: str) -> float | None:
        reply = await client.context(tenant=TENANT, question=text, budget_tokens=BUDGET, asked_at=asked_at)
        return reply.latency_ms

    return read


async def under_load(client: EpistreamClient, settings: Settings, questions: list[str], asked_at: datetime, *,
                     reads: int) -> Timings:
    """4 callers while 2 deep questions are always in flight and ingest takes 50 turns/s."""
    stop = asyncio.Event()

    async def deep_questions() -> None:
        while not stop.is_set():
            question = Question(question_id=f"b-deep-{uuid.uuid4()}", tenant=TENANT, question=questions[0],
                                mode=Mode.DEEP, asked_at=asked_at)
            try:
                await client.ask(question, timeout_s=600)
            except Exception as exc:  # noqa: BLE001 (a slow model: the load goes on)
                print(f"  deep question: {type(exc).__name__}: {exc}", flush=True)

    async def ingest() -> None:
        conversation, n, start = f"bench-load-{uuid.uuid4().hex[:8]}", 0, datetime(2025, 1, 1, tzinfo=UTC)
        while not stop.is_set():
            batch = [Turn(tenant="bench-load", conversation_id=conversation, turn_id=f"t{n + i:06d}", speaker="Load",
                          text=f"Load turn {n + i}: the ferry left at {(n + i) % 24}:00 and the cat slept.",
                          ts=start + timedelta(seconds=n + i), session_id="s1") for i in range(5)]
            n += 5
            await client.produce_turns(batch)
            await asyncio.sleep(0.1)  # 5 turns every 0.1 s: 50 turns/s

    load = [asyncio.create_task(deep_questions()), asyncio.create_task(deep_questions()),
            asyncio.create_task(ingest())]
    try:
        await asyncio.sleep(5)  # the deep questions reach the model, ingest is steady
        return await closed_loop(client_read(client, asked_at), questions, callers=4, reads=reads)
    finally:
        stop.set()
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def mcp_server() -> AsyncIterator[str]:
    """`epistream mcp --transport http` for the tenant, as a process; its endpoint's URL."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "epistream.apps.cli.main", "mcp", "--tenant", TENANT,
                               "--transport", "http", "--port", str(port)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP server did not start") from None
                await asyncio.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=30)


async def mcp_phase(questions: list[str], *, callers: int, reads: int) -> Timings:
    """`callers` MCP sessions (the mcp SDK's client, each in its own task, as its cancel scopes require),
    each calling `recall` back to back until `reads` calls are done."""
    from mcp import Client

    timings, left = Timings(), iter(range(reads))
    ready, go = asyncio.Barrier(callers + 1), asyncio.Event()

    async def caller(url: str, n: int) -> None:
        async with Client(url, read_timeout_seconds=60) as session:
            async def recall(text: str) -> float | None:
                result = await session.call_tool("recall", {"question": text, "budget_tokens": BUDGET})
                if result.is_error:
                    raise RuntimeError(result.content[0].text)
                return None

            await recall(questions[n % len(questions)])  # warm: the session, the server's client
            await ready.wait()
            await go.wait()
            await _reads(recall, questions, left, timings, offset=n)

    async with mcp_server() as url:
        tasks = [asyncio.create_task(caller(url, n)) for n in range(callers)]
        await ready.wait()
        started = time.perf_counter()
        go.set()
        await asyncio.gather(*tasks)
        timings.wall_s = time.perf_counter() - started
    return timings


def cpu_per_read(settings: Settings, before: CpuSnapshot, reads: int) -> dict[str, float]:
    """CPU milliseconds per read each process spent since `before` (this stack's by service name)."""
    report_ = cpu_report(settings, before, CpuSnapshot.take())
    return {row["process"]: round(1000 * row["cpu_s"] / max(1, reads), 2)  # type: ignore[index]
            for row in report_["top_processes"]}  # type: ignore[union-attr]


async def profiled(settings: Settings, read: Read, questions: list[str], *, seconds: float) -> dict[str, Any]:
    """8 callers for about `seconds` while py-spy samples the answer worker and this process (the client),
    and each process's CPU time per read is counted."""
    worker_pid = managed_pid(settings, "worker-answer")
    timings, left = Timings(), iter(range(10**9))
    before = CpuSnapshot.take()
    callers = [asyncio.create_task(_reads(read, questions, left, timings, offset=n)) for n in range(8)]
    try:
        worker, client = await asyncio.gather(
            asyncio.to_thread(py_spy.profile, worker_pid, seconds) if worker_pid else asyncio.sleep(0),
            asyncio.to_thread(py_spy.profile, os.getpid(), seconds))
    finally:
        for task in callers:
            task.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
    return {"answer_worker": worker, "client": client, "seconds": seconds, "reads": len(timings.caller_s),
            "cpu_ms_per_read": cpu_per_read(settings, before, len(timings.caller_s))}


async def measure(settings: Settings, *, reads: int, concurrency: list[int], profile_s: float) -> dict[str, Any]:
    turns = sample_turns()
    asked_at = asked_at_for(turns)
    questions = [q["question"] for q in sample_questions()]
    results: dict[str, Any] = {"in_process": {}, "caller": {}, "mcp": {}}
    async with EpistreamClient(settings) as client:
        read = client_read(client, asked_at)
        await closed_loop(read, questions, callers=4, reads=40)  # warm: the worker's partitions and pools

        async def phase(name: str, run: Awaitable[Timings]) -> None:
            print(f"caller, {name}", flush=True)
            before = _profile_totals(settings)
            results["caller"][name] = (await run).summary() | {"worker": worker_profile(before, _profile_totals(settings))}
            print(f"  {results['caller'][name]}", flush=True)

        await phase("idle", closed_loop(read, questions, callers=1, reads=reads // 2, pause_s=0.2))
        # Each concurrency in process, then through Kafka (then MCP) right after: a drift of the machine's
        # speed (its cores are shared with other machines) falls on the pair alike.
        for n in concurrency:
            print(f"in process, {n} at a time", flush=True)
            results["in_process"][f"concurrent_{n}"] = (await in_process(settings, questions, asked_at, callers=n,
                                                                          reads=reads)).summary()
            print(f"  {results['in_process'][f'concurrent_{n}']}", flush=True)
            await phase(f"concurrent_{n}", closed_loop(read, questions, callers=n, reads=max(reads, 4 * n)))
            if n == 8:
                print("mcp, 8 at a time", flush=True)
                results["mcp"]["concurrent_8"] = (await mcp_phase(questions, callers=8, reads=reads)).summary()
                print(f"  {results['mcp']['concurrent_8']}", flush=True)
        if profile_s:
            print(f"profile: 8 at a time for {profile_s:g}s, py-spy on the answer worker and the client", flush=True)
            results["profile"] = await profiled(settings, read, questions, seconds=profile_s)
            print(f"  {results['profile']}", flush=True)
        await phase("under_load", under_load(client, settings, questions, asked_at, reads=reads))
    return results


def goals(r: dict[str, Any]) -> dict[str, bool]:
    caller, local, mcp = r["caller"], r["in_process"], r["mcp"]
    c8, l8, m8 = caller["concurrent_8"], local["concurrent_8"], mcp["concurrent_8"]
    return {
        "caller.idle p95 <= 40 ms": caller["idle"]["p95_ms"] <= 40,
        "caller.concurrent_8 reads/s >= 0.8 x in_process": c8["reads_per_s"] >= 0.8 * l8["reads_per_s"],
        "caller.concurrent_8 p95 <= 1.5 x in_process": c8["p95_ms"] <= 1.5 * l8["p95_ms"],
        "caller.under_load p95 <= 200 ms": caller["under_load"]["p95_ms"] <= 200,
        "mcp.concurrent_8 within 1.2 x caller": m8["p95_ms"] <= 1.2 * c8["p95_ms"]
        and m8["reads_per_s"] >= c8["reads_per_s"] / 1.2,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    fig, ax = report.subplots(figsize=(7, 4))
    for group, label in (("in_process", "in process (no Kafka)"), ("caller", "at the caller (Kafka)")):
        points = sorted((int(k.split("_")[1]), v["p95_ms"]) for k, v in result[group].items()
                        if k.startswith("concurrent_"))
        ax.plot([n for n, _ in points], [p for _, p in points], marker="o", label=label)
    ax.plot([8], [result["mcp"]["concurrent_8"]["p95_ms"]], marker="s", linestyle="", label="MCP recall")
    ax.axhline(result["caller"]["under_load"]["p95_ms"], color="grey", linestyle=":", label="caller, under load (4)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent callers")
    ax.set_ylabel("p95 latency (ms)")
    ax.set_title(f"context read, budget {BUDGET} (load avg {result['machine']['loadavg_1_5_15'][0]})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(result: dict[str, Any]) -> str:
    rows = [(f"{group}.{name}", v["p50_ms"], v["p95_ms"], v["reads_per_s"], v.get("worker_p50_ms", ""),
             v.get("worker_p95_ms", "")) for group in ("in_process", "caller", "mcp")
            for name, v in result[group].items()]
    goals_table = report.table(("goal", "met"), [(g, "yes" if ok else "**no**") for g, ok in result["goals"].items()])
    return report.table(("read", "p50 ms", "p95 ms", "reads/s", "worker p50 ms", "worker p95 ms"), rows) \
        + "\n\n" + goals_table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.reads", description=__doc__.splitlines()[0])
    p.add_argument("--reads", type=int, default=200, help="reads per phase")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--profile-s", type=float, default=10.0,
                   help="seconds of py-spy profiles of the answer worker and the client, 8 at a time (0: none)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings()
    up(settings)
    asyncio.run(produce_turns(settings, sample_turns()))  # the demo's turns: stored once, however often sent
    wait_until_stored(settings, sample_turns())
    for name in ("model-server", "worker-enrich"):  # nothing of the demo's enrichment left running
        wait_until_idle(managed_pid(settings, name), quiet_s=15)
    load_before = [round(x, 2) for x in os.getloadavg()]
    measured = asyncio.run(measure(settings, reads=args.reads, concurrency=sorted(set(args.concurrency) | {1, 8}),
                                   profile_s=args.profile_s))
    result = {"machine": report.machine_info(ROOT), "load_before": load_before, "budget_tokens": BUDGET,
              "tenant": TENANT, **measured,
              "settings": {"answer_read_concurrency": settings.answer_read_concurrency,
                           "answer_model_concurrency": settings.answer_model_concurrency,
                           "questions_partitions": settings.questions_partitions}}
    result["git_commit"] = result["machine"]["git_commit"]
    result["timestamp"] = result["machine"]["timestamp"]
    result["goals"] = goals(result)
    report.write_results(args.results, result, plot, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
