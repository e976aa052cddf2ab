"""What Faust itself does to records around rebalances, on a real broker: plain Faust workers (a slow
agent with a small buffer, acknowledging each record after handling it, as the indexer and the enrich
worker do; nothing of epistream's between Faust and the records: no stall guard, no gap healing) in
one consumer group, while a second member joins and leaves again and again (SIGTERM, then SIGKILL).

    python -m epistream.testing.rebalance_probe churn BOOTSTRAP WORKDIR [--unpatched] [--records N] [--churn-s S]
    python -m epistream.testing.rebalance_probe worker BOOTSTRAP TOPIC GROUP HANDLED_FILE STATE_DIR [--unpatched]

`churn` produces the records, runs the workers, lets the group settle and prints what it found as
JSON: per partition the group's committed offset, the log's end, the offsets no worker handled, and
those the group committed past all the same (lost to the group). Workers run with epistream's fix of
Faust (epistream.messaging.faust_fixes) unless --unpatched is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import faust

from epistream.messaging.kafka_io import faust_broker_options, faust_datadir, partition_lag
from epistream.messaging.topics import create_topic
from epistream.settings.processes import Settings

log = logging.getLogger("rebalance_probe")

HANDLE_S = float(os.environ.get("PROBE_HANDLE_S", "0.05"))  # slow enough that the agent's buffer fills and a fetched batch waits to be delivered
BUFFER = 4
PARTITIONS = 4


def create_app(settings: Settings, topic: str, group: str, handled: Path) -> faust.App:
    app = faust.App(group, **faust_broker_options(settings), store="memory://", web_enabled=False,
                    autodiscover=False, consumer_auto_offset_reset="earliest", topic_allow_declare=False,
                    topic_disable_leader=True, datadir=faust_datadir(settings, group),
                    stream_buffer_maxsize=BUFFER, broker_commit_interval=0.5,
                    broker_session_timeout=6.0, broker_heartbeat_interval=1.0)
    source = app.topic(topic, key_serializer="raw", value_serializer="raw")

    @app.agent(source)
    async def handle(stream: faust.StreamT[bytes]) -> None:
        manual = cast("faust.Stream[bytes]", stream).noack()
        async for event in manual.events():
            await asyncio.sleep(HANDLE_S)
            message = event.message
            with handled.open("a") as out:
                out.write(f"{message.partition} {message.offset}\n")
            await manual.ack(event)

    return app


def run_worker(bootstrap: str, topic: str, group: str, handled: str, state_dir: str, *, patched: bool) -> None:
    if patched:
        from epistream.messaging import faust_fixes

        faust_fixes.apply()
    settings = Settings().with_overrides(kafka_bootstrap=bootstrap, home=Path(state_dir))
    app = create_app(settings, topic, group, Path(handled))
    faust.Worker(app, loglevel="INFO", quiet=True).execute_from_commandline()


@dataclass
class PartitionFinding:
    partition: int
    committed: int
    end: int
    unhandled: list[int] = field(default_factory=list)
    #: Offsets below the committed one that no worker handled: the group will never read them again.
    lost: list[int] = field(default_factory=list)


@dataclass
class ChurnFinding:
    topic: str
    patched: bool
    records: int
    rebalances: int
    partitions: list[PartitionFinding]

    @property
    def lost(self) -> int:
        return sum(len(p.lost) for p in self.partitions)

    @property
    def settled(self) -> bool:
        return all(p.committed >= p.end for p in self.partitions)


def churn(settings: Settings, workdir: Path, *, patched: bool, records: int = 1200, churn_s: float = 40.0,
          up_s: float = 5.0, down_s: float = 4.0, settle_s: float = 90.0, pause_broker: bool = False) -> ChurnFinding:
    """Produce `records` over PARTITIONS partitions, run worker A throughout and a second member that
    joins for `up_s` and leaves (SIGTERM and SIGKILL in turn) for `down_s`, for `churn_s`; then wait up
    to `settle_s` for the group to commit the whole log, and say what was handled and committed."""
    run = uuid.uuid4().hex[:8]
    topic, group = f"probe-{run}", f"probe-group-{run}"
    workdir.mkdir(parents=True, exist_ok=True)
    handled = workdir / "handled.txt"
    asyncio.run(create_topic(settings, topic, partitions=PARTITIONS))
    _produce(settings.kafka_bootstrap, topic, records)

    def start(name: str) -> subprocess.Popen[bytes]:
        with (workdir / f"{name}.log").open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "epistream.testing.rebalance_probe", "worker", settings.kafka_bootstrap,
                 topic, group, str(handled), str(workdir / f"home-{name}"), *([] if patched else ["--unpatched"])],
                stdout=out, stderr=subprocess.STDOUT)

    first = start("a")
    rebalances = 0
    try:
        time.sleep(up_s)
        started = time.monotonic()
        while pause_broker and time.monotonic() - started < churn_s:
            from epistream.infra import services

            services.pause_service(settings, "kafka")  # past the session timeout: the group rebalances
            time.sleep(down_s)
            services.resume_service(settings, "kafka")
            time.sleep(up_s)
            rebalances += 1
        while time.monotonic() - started < churn_s:
            second = start(f"b{rebalances}")
            time.sleep(up_s)
            second.send_signal(signal.SIGTERM if rebalances % 2 == 0 else signal.SIGKILL)
            second.wait()
            time.sleep(down_s)
            rebalances += 1
        deadline = time.monotonic() + settle_s
        lag = asyncio.run(partition_lag(settings, group, [topic]))
        while not all(done >= end for done, end in lag.values()) and time.monotonic() < deadline:
            time.sleep(1.0)
            lag = asyncio.run(partition_lag(settings, group, [topic]))
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.wait(timeout=30)
        except subprocess.TimeoutExpired:
            first.kill()
    seen: defaultdict[int, set[int]] = defaultdict(set)
    for line in handled.read_text().splitlines() if handled.exists() else []:
        partition, offset = line.split()
        seen[int(partition)].add(int(offset))
    findings = []
    for (_, partition), (done, end) in sorted(lag.items()):
        unhandled = sorted(set(range(end)) - seen[partition])
        findings.append(PartitionFinding(partition, done, end, unhandled, [o for o in unhandled if o < done]))
    return ChurnFinding(topic, patched, records, 2 * rebalances, findings)


def _produce(bootstrap: str, topic: str, records: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for n in range(records):
            producer.send(topic, value=f"record {n}".encode(), partition=n % PARTITIONS)
        producer.flush(timeout=60)
    finally:
        producer.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m epistream.testing.rebalance_probe")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("churn")
    c.add_argument("bootstrap")
    c.add_argument("workdir", type=Path)
    c.add_argument("--unpatched", action="store_true")
    c.add_argument("--records", type=int, default=1200)
    c.add_argument("--churn-s", type=float, default=40.0)
    w = sub.add_parser("worker")
    for name in ("bootstrap", "topic", "group", "handled", "state_dir"):
        w.add_argument(name)
    w.add_argument("--unpatched", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "worker":
        sys.argv = sys.argv[:1]  # Faust's worker reads the command line
        run_worker(args.bootstrap, args.topic, args.group, args.handled, args.state_dir, patched=not args.unpatched)
        return
    settings = Settings().with_overrides(kafka_bootstrap=args.bootstrap, home=args.workdir / "home")
    finding = churn(settings, args.workdir, patched=not args.unpatched, records=args.records, churn_s=args.churn_s)
    print(json.dumps({**asdict(finding), "lost": finding.lost, "settled": finding.settled}, indent=1))


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("PROBE_LOG", "WARNING"))
    main(sys.argv[1:])
