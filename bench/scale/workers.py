"""Several workers in one consumer group, side by side in one run, on the embedded stack.

    python -m bench.scale.workers [--start] [--down] [--turns 2000] [--stream-turns 3000] [--rate 30]
                                  [--questions 4] [--context-questions 40]

1. Ingest throughput with 1, 2 and 3 ingest workers in the indexer's group on memory.turns: the same texts
   in each phase (a tenant of its own), laid out so that no segment closes (bench.workload.segment_free,
   spread evenly over the partitions), all produced at once; total turns/s, each worker's turns (its own
   epistream_ingest_turns_total), CPU seconds and the load average.
2. A rebalance mid-stream: turns streamed at a steady rate while a fourth worker joins and one is killed
   with SIGKILL; every record read back from the log and compared with the rows (count, distinct ids,
   kafka_partition/kafka_offset provenance); the time from the kill to the first turn stored on the killed
   worker's partitions, and until they caught up.
3. Answer workers: the same questions with 1 and 2 answer workers in their group (memory.questions has 2
   partitions), each answered exactly once (committed replies read back), in fast mode (a model call each)
   and in context mode (no model).

The first worker of each kind is the supervised one; the others are `epistream worker ...` processes beside
it (bench.faults.inject.spawn_worker), stopped at the end. Writes bench/results/workers.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from epistream.contracts import Mode, Question, Turn
from epistream.db import admin_database_url
from epistream.health import worker_group
from epistream.kafka_io import create_admin, create_producer, partitions_of, worker_client_id
from epistream.metrics import read_samples, sample_sum
from epistream.readiness import poll
from epistream.settings import Settings

from ..cleanup import forget_tenants, seal_tenant
from ..faults.inject import ExtraWorker, FaultLog, spawn_worker
from ..faults.observe import read_since, topic_ends
from ..ingest import WarmUp, row_timings, wait_for_rows, warm_up
from ..produce import Record, send_burst, send_steady
from ..report import write_results
from ..stack import CpuSnapshot, cpu_report, managed_pid, process_cpu_seconds, worker_setting
from ..workload import segment_free
from ..workload_scale import WorkloadSpec, conversation_questions, turns
from .workers_check import Row, Timed, account, answered, even_share, speedup_bound, takeover

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench" / "results" / "workers.json"
#: The texts: 16 conversations of dated sessions (bench.workload_scale), rewritten segment-free.
SHAPE = dict(tenants=1, conversations_per_tenant=16, sessions_per_conversation=20, turns_per_session=20)
#: Extra workers serve /metrics at the supervised worker's port + these (9151, 9161, 9171; answer 9152).
INGEST_OFFSETS = (50, 60, 70)
ANSWER_OFFSET = 50
SETTLE_S = 240.0


@dataclass
class Member:
    """One worker of a group: the supervised one (`extra` None) or one started beside it."""

    worker: str  # ingest | answer
    name: str
    pid: int
    metrics_port: int
    extra: ExtraWorker | None = None

    @property
    def client_id(self) -> str:
        return worker_client_id(self.worker, pid=self.pid)

    def counter(self, name: str) -> float | None:
        try:
            return sample_sum(read_samples(f"http://127.0.0.1:{self.metrics_port}/metrics", 3.0), name)
        except OSError:
            return None


def supervised(settings: Settings, worker: str) -> Member:
    pid = managed_pid(settings, f"worker-{worker}")
    if pid is None:
        raise SystemExit(f"worker-{worker} is not running (start the stack, or pass --start)")
    return Member(worker, f"worker-{worker}", pid, getattr(settings, f"{worker}_metrics_port"))


def spawn(settings: Settings, log: FaultLog, worker: str, offset: int) -> Member:
    extra = spawn_worker(settings, log, worker, metrics_offset=offset, need_partitions=False)
    return Member(worker, f"{worker}+{offset}", extra.pid, getattr(settings, f"{worker}_metrics_port") + offset,
                  extra)


# --- the group as Kafka sees it ---------------------------------------------------------------------


async def group_view(settings: Settings, group: str, topic: str) -> tuple[str, dict[str, list[int]]]:
    """The group's state and each member's partitions of `topic`, by client id."""
    admin = create_admin(settings, request_timeout_ms=5_000)
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    rows = [g for response in responses for g in response.groups if g[1] == group]
    if not rows:
        return "Dead", {}
    held = {m[1]: sorted(tp.partition for tp in ConsumerProtocolMemberAssignment.decode(m[-1]).partitions()
                         if tp.topic == topic) if m[-1] else [] for m in rows[0][5]}
    return rows[0][2], held


def settled(settings: Settings, worker: str, members: list[Member], topic: str) -> dict[str, list[int]]:
    """Wait until the group is stable with exactly these members and every partition of `topic` assigned;
    each member's partitions, by name."""
    wanted = {m.client_id: m.name for m in members}
    partitions = len(asyncio.run(partitions_of(settings, topic)))

    def read() -> tuple[str, dict[str, list[int]]]:
        return asyncio.run(group_view(settings, worker_group(settings, worker), topic))

    def done(view: tuple[str, dict[str, list[int]]]) -> bool:
        state, held = view
        return state == "Stable" and set(held) == set(wanted) and sum(map(len, held.values())) == partitions

    _, held = poll(read, done, what=f"the {worker} group settled with {len(members)} members", timeout_s=SETTLE_S,
                   interval_s=1.0)
    return {wanted[c]: ps for c, ps in held.items()}


# --- ingest -----------------------------------------------------------------------------------------


def base_turns(run: str, count: int) -> list[Turn]:
    spec = WorkloadSpec(**SHAPE, prefix=f"{run}-base")  # type: ignore[arg-type]
    return list(itertools.islice(turns(spec), count))


def laid_out(base: list[Turn], tenant: str, partitions: list[int], max_tokens: int) -> list[Record]:
    """The same texts under another tenant, segment-free, spread evenly over the partitions."""
    old = base[0].tenant
    moved = [t.model_copy(update={"tenant": tenant, "conversation_id": t.conversation_id.replace(old, tenant, 1)})
             for t in base]
    return segment_free(moved, partitions=partitions, max_tokens=max_tokens).records


def warm(settings: Settings, url: str, run: str, tag: str, partitions: list[int]) -> WarmUp:
    """Two turns a partition through the group: every member has embedded a batch before a phase."""
    tenant = f"{run}-warm-{tag}"
    at = datetime(2024, 1, 1, tzinfo=UTC)
    records = [Record.of(Turn(tenant=tenant, conversation_id=f"{tenant}-{p}", turn_id=f"w{i}", speaker="Ana",
                              text=f"warming up partition {p}, turn {i}", ts=at.replace(second=i)), p)
               for p in partitions for i in range(2)]
    return warm_up(settings, url, records)


def ingest_phase(settings: Settings, url: str, members: list[Member], records: list[Record], tenant: str,
                 held: dict[str, list[int]]) -> dict[str, Any]:
    turns_name = "epistream_ingest_turns_total"
    counted = {m.name: m.counter(turns_name) for m in members}
    cpu = {m.name: process_cpu_seconds(m.pid) for m in members}
    snapshot = CpuSnapshot.take()
    started = time.perf_counter()
    asyncio.run(send_burst(settings, records))
    wall = wait_for_rows(url, tenant, len(records)) - started
    seal_tenant(url, tenant)
    load = os.getloadavg()
    machine = cpu_report(settings, snapshot, CpuSnapshot.take())
    time.sleep(0.5)  # the counters move just after the commit that made the rows visible
    per_worker = []
    for m in members:
        after, cpu_after = m.counter(turns_name), process_cpu_seconds(m.pid)
        done = None if after is None or counted[m.name] is None else after - counted[m.name]  # type: ignore[operator]
        used = None if cpu_after is None or cpu[m.name] is None else cpu_after - cpu[m.name]  # type: ignore[operator]
        per_worker.append({"worker": m.name, "partitions": held.get(m.name, []), "turns": done,
                           "turns_per_s": None if done is None else round(done / wall, 1),
                           "cpu_s": None if used is None else round(used, 1),
                           "cores_used": None if used is None else round(used / wall, 2),
                           "turns_per_cpu_s": round(done / used, 1) if done and used else None})
    latencies, _ = row_timings(url, tenant)
    return {"workers": len(members), "tenant": tenant, "turns": len(records), "wall_s": round(wall, 2),
            "turns_per_s": round(len(records) / wall, 1), "per_worker": per_worker,
            "latency_p50_s": round(float(sorted(latencies)[len(latencies) // 2]), 2),
            "load_average": [round(x, 2) for x in load], "machine_cpu": machine,
            "machine_busy_share": round(machine["machine_busy_cpu_s"] / (wall * machine["cores"]), 2)}


# --- the rebalance --------------------------------------------------------------------------------


def stored_rows(url: str, tenant: str) -> tuple[list[Row], list[Timed]]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT conversation_id, turn_id, kafka_partition, kafka_offset, extract(epoch FROM produced_at)::float8, "
            "extract(epoch FROM stored_at)::float8 FROM memory.turns WHERE tenant = %s", (tenant,)).fetchall()
    return [Row(c, t, p, o) for c, t, p, o, _, _ in found], [Timed(p, pa, sa) for _, _, p, _, pa, sa in found]


def produced_rows(settings: Settings, start: dict[int, int], conversations: set[bytes]) -> list[Row]:
    records = asyncio.run(read_since(settings, settings.topic_turns, start, keys=conversations))
    out = []
    for r in records:
        turn = Turn.from_bytes(r.value)
        out.append(Row(turn.conversation_id, turn.turn_id, r.partition, r.offset))
    return out


def rebalance(settings: Settings, url: str, log: FaultLog, members: list[Member], records: list[Record],
              tenant: str, rate: float, *, join_at: float = 0.2, kill_at: float = 0.5) -> tuple[dict, list[Member]]:
    """Stream `records` at `rate`; a worker joins at `join_at` of the stream, and at `kill_at` the extra
    worker holding the most partitions is SIGKILLed. Returns the figures and the members left."""
    topic = settings.topic_turns
    start = asyncio.run(topic_ends(settings, [topic]))[topic]
    sent: list[Any] = []
    stream = threading.Thread(target=lambda: sent.append(asyncio.run(send_steady(settings, records, rate))),
                              name="workers-stream", daemon=True)
    began = time.monotonic()
    stream.start()
    duration = len(records) / rate
    time.sleep(max(0.0, began + join_at * duration - time.monotonic()))
    joined = spawn(settings, log, "ingest", INGEST_OFFSETS[-1])
    members = [*members, joined]
    before_kill = settled(settings, "ingest", members, topic)
    time.sleep(max(0.0, began + kill_at * duration - time.monotonic()))
    victim = max((m for m in members if m.extra is not None), key=lambda m: len(before_kill[m.name]))
    victim_turns = victim.counter("epistream_ingest_turns_total")
    killed_at = time.time()
    victim.extra.kill9()  # type: ignore[union-attr]
    log.note(f"SIGKILL {victim.name} (pid {victim.pid}), which held partitions {before_kill[victim.name]}")
    survivors = [m for m in members if m is not victim]
    after_kill = settled(settings, "ingest", survivors, topic)
    log.note(f"group settled without it: {after_kill}")
    stream.join()
    wait_for_rows(url, tenant, len(records), stall_s=300)
    seal_tenant(url, tenant)
    conversations = {r.key for r in records}
    produced = produced_rows(settings, start, conversations)
    rows, timed = stored_rows(url, tenant)
    counts = account(produced, rows)
    moved = takeover(timed, killed_at=killed_at, moved=before_kill[victim.name])
    idle_before = [name for name, ps in before_kill.items() if not ps]
    return {
        "tenant": tenant, "turns": len(records), "rate_per_s": rate,
        "achieved_per_s": round(sent[0].achieved_per_s, 1) if sent else None,
        "joined": joined.name, "killed": victim.name, "killed_turns_counted_before_kill": victim_turns,
        "partitions_before_kill": before_kill, "partitions_after_kill": after_kill,
        "idle_members_before_kill": idle_before,
        "accounting": counts.as_json(), "takeover": moved.as_json(),
        "events": [{"at_s": at, "what": what} for at, what in log.events],
    }, survivors


# --- answers ----------------------------------------------------------------------------------------


async def send_questions(settings: Settings, questions: list[Question], partitions: list[int]) -> None:
    """Round-robin over the partitions, so each answer worker gets its share."""
    producer = create_producer(settings)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(settings.topic_questions, key=q.question_id.encode(),
                                                   value=q.to_bytes(), partition=partitions[i % len(partitions)])
                               for i, q in enumerate(questions)])
    finally:
        await producer.stop()


def answer_phase(settings: Settings, members: list[Member], tenant: str, texts: list[str], mode: Mode,
                 tag: str, timeout_s: float) -> dict[str, Any]:
    held = settled(settings, "answer", members, settings.topic_questions)
    asked_at = datetime(2025, 1, 1, tzinfo=UTC)
    questions = [Question(question_id=f"{tag}-q{i:03d}", tenant=tenant, question=text, mode=mode, asked_at=asked_at)
                 for i, text in enumerate(texts)]
    keys = {q.question_id.encode() for q in questions}
    start = asyncio.run(topic_ends(settings, [settings.topic_answers]))[settings.topic_answers]
    partitions = asyncio.run(partitions_of(settings, settings.topic_questions))
    model = managed_pid(settings, "model-server")
    cpu = {m.name: process_cpu_seconds(m.pid) for m in members} | {"model-server": process_cpu_seconds(model)}
    began = time.time()
    asyncio.run(send_questions(settings, questions, partitions))

    def replies() -> list:
        return asyncio.run(read_since(settings, settings.topic_answers, start, keys=keys))

    found = poll(replies, lambda rs: {r.key for r in rs} >= keys, what=f"{len(keys)} {mode.value} replies",
                 timeout_s=timeout_s, interval_s=1.0, progress=len)
    found = replies()  # once more: a second reply to a question would show now
    wall = max(r.timestamp for r in found) / 1000 - began
    used: dict[str, float | None] = {}
    for name, pid in [(m.name, m.pid) for m in members] + [("model-server", model)]:
        now = process_cpu_seconds(pid)
        used[name] = None if now is None or cpu[name] is None else round(now - cpu[name], 1)  # type: ignore[operator]
    bodies = [json.loads(r.value) for r in found]
    return {"mode": mode.value, "workers": len(members), "partitions": held, "questions": len(questions),
            "wall_s": round(wall, 2), "questions_per_min": round(60 * len(questions) / wall, 2),
            "with_error": sum(1 for b in bodies if b.get("error")),
            "latency_ms_p50": sorted(b.get("latency_ms", 0) for b in bodies)[len(bodies) // 2]
            if mode is not Mode.CONTEXT else None,
            "cpu_s": used, "model_server_cores_used": round(used["model-server"] / wall, 2)
            if used.get("model-server") is not None else None,
            "accounting": answered([q.question_id for q in questions],
                                   [r.key.decode() for r in found]).as_json()}


# --- the run ----------------------------------------------------------------------------------------


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    url = admin_database_url(settings)
    run_id = f"bench-workers-{uuid.uuid4().hex[:6]}"
    topic = settings.topic_turns
    partitions = asyncio.run(partitions_of(settings, topic))
    max_tokens = int(worker_setting(settings, "segment_max_tokens") or 4096)
    base = base_turns(run_id, max(args.turns, args.stream_turns))
    log = FaultLog()
    ingest = [supervised(settings, "ingest")]
    answer = [supervised(settings, "answer")]
    tenants: list[str] = []
    phases: list[dict[str, Any]] = []
    report: dict[str, Any] = {"run": run_id, "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                              "cores": len(os.sched_getaffinity(0)), "turns_partitions": len(partitions),
                              "questions_partitions": len(asyncio.run(partitions_of(settings,
                                                                                    settings.topic_questions)))}
    try:
        for count in (1, 2, 3):
            if count > 1:
                ingest.append(spawn(settings, log, "ingest", INGEST_OFFSETS[count - 2]))
            held = settled(settings, "ingest", ingest, topic)
            warmed = warm(settings, url, run_id, str(count), partitions)
            tenants += [f"{run_id}-warm-{count}", f"{run_id}-i{count}"]
            records = laid_out(base[:args.turns], tenants[-1], partitions, max_tokens)
            phase = ingest_phase(settings, url, ingest, records, tenants[-1], held)
            phase["warm_up_s"] = round(warmed.seconds, 1)
            phase["speedup_bound_by_partitions"] = speedup_bound(len(partitions), count)
            log.note(f"{count} ingest workers: {phase['turns_per_s']} turns/s, load {phase['load_average'][0]}")
            phases.append(phase)
        tenants.append(f"{run_id}-stream")
        records = laid_out(base[:args.stream_turns], tenants[-1], partitions, max_tokens)
        report["rebalance"], ingest = rebalance(settings, url, log, ingest, records, tenants[-1], args.rate)
        for m in ingest:
            if m.extra is not None:
                m.extra.stop()
        ingest = ingest[:1]
        spec = WorkloadSpec(**SHAPE, prefix=f"{run_id}-base")  # type: ignore[arg-type]
        texts = [q.question for i in range(SHAPE["conversations_per_tenant"])
                 for q in conversation_questions(spec, i, limit=3)]
        report["answers"] = []
        for count in (1, 2):
            if count == 2:
                answer.append(spawn(settings, log, "answer", ANSWER_OFFSET))
            for mode, n in ((Mode.FAST, args.questions), (Mode.CONTEXT, args.context_questions)):
                if n:
                    result = answer_phase(settings, answer, f"{run_id}-i1", texts[:n], mode,
                                          f"{run_id}-{mode.value}{count}", timeout_s=120 + 90 * n)
                    log.note(f"{count} answer workers, {mode.value}: {result['questions_per_min']} questions/min")
                    report["answers"].append(result)
    finally:
        for m in ingest + answer:
            if m.extra is not None:
                m.extra.stop()
        removed = forget_tenants(url, tenants)
        log.note(f"removed the run's rows ({removed.get('turns', 0)} turns)")
    reb = report["rebalance"]["accounting"]
    return {
        "what": "several workers in one consumer group on the embedded stack: ingest throughput with 1, 2, 3 "
                "ingest workers (same texts, produced at once), a rebalance mid-stream (a worker joins, one "
                "is SIGKILLed) checked against the log, and 1 vs 2 answer workers",
        "workers": [p["workers"] for p in phases], "turns": [p["turns"] for p in phases],
        "turns_per_s": [p["turns_per_s"] for p in phases],
        "per_worker_turns_per_s": [[w["turns_per_s"] for w in p["per_worker"]] for p in phases],
        "lost": reb["lost"], "duplicated": reb["duplicated"],
        **report, "phases": phases, "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "partitions_split": {str(n): even_share(len(partitions), n) for n in (1, 2, 3, 4)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=2000, help="turns per throughput phase")
    parser.add_argument("--stream-turns", type=int, default=3000, help="turns of the rebalance stream")
    parser.add_argument("--rate", type=float, default=30.0, help="the rebalance stream's turns/s")
    parser.add_argument("--questions", type=int, default=4, help="fast-mode questions per answer phase (0: none)")
    parser.add_argument("--context-questions", type=int, default=40, help="context-mode questions per answer phase")
    parser.add_argument("--start", action="store_true", help="start the embedded stack first")
    parser.add_argument("--down", action="store_true", help="stop the embedded stack at the end")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    settings = Settings()
    from epistream.infra import services

    if args.start:
        services.up(settings)
    try:
        report = run(args, settings)
    finally:
        if args.down:
            services.down(settings)
    write_results(args.out, report, plot)
    return 0


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ingest, answers) = plt.subplots(1, 2, figsize=(11, 4.2))
    workers = report["workers"]
    ingest.plot(workers, report["turns_per_s"], "-o", label="total turns/s")
    for n, per in zip(workers, report["per_worker_turns_per_s"], strict=True):
        ingest.scatter([n] * len(per), [p or 0 for p in per], marker="x", color="grey")
    ingest.scatter([], [], marker="x", color="grey", label="each worker's turns/s")
    per_cpu_s = report["phases"][0]["per_worker"][0]["turns_per_cpu_s"]
    if per_cpu_s:  # what every core of the machine would give at one worker's turns per CPU-second
        ingest.axhline(per_cpu_s * report["cores"], linestyle=":", color="grey",
                       label=f"CPU ceiling: {per_cpu_s} turns/CPU-s x {report['cores']} cores")
    ingest.set(xticks=workers, xlabel="ingest workers in the group", ylabel="turns/s", ylim=(0, None),
               title=f"ingest, {report['turns'][0]} turns a phase, {report['turns_partitions']} partitions")
    ingest.legend(fontsize=8)
    for mode in ("fast", "context"):
        rows = [a for a in report.get("answers", []) if a["mode"] == mode]
        if rows:
            answers.plot([a["workers"] for a in rows], [a["questions_per_min"] for a in rows], "-o",
                         label=f"{mode} ({rows[0]['questions']} questions)")
    answers.set(xticks=[1, 2], xlabel="answer workers in the group", ylabel="questions/min", yscale="log",
                title="answers")
    answers.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
