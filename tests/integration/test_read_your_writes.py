"""Read-your-own-writes through the real stack (issue 30, deliverable 2): turns produced with the
project's client return their positions; a `context` read given them right away contains them. With
the ingest worker stopped the read gives up at its bound and says so; an ingest worker joining and
another leaving mid-stream never turn a read silently stale. The ingest and answer workers run as
processes on their own topics and database; their model endpoint must receive nothing."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from kafka import KafkaProducer

from epistream.client.api import context, produce_turns
from epistream.contracts.positions import Position
from epistream.contracts.replies import MemoryContext
from epistream.contracts.turns import Turn
from epistream.core.metrics import read_samples, sample_sum
from epistream.infra.process import ManagedProcess
from epistream.infra.stack import worker_argv

from .conftest import wait_for
from .recall import holds, own_turn, recall, recall_now
from .scripted_worker import PORT_OFFSET, Scripted, no_model_call, scripted_worker

pytestmark = pytest.mark.integration

METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 70  # beside the test stack's ports
SECOND_INGEST_PORT = METRICS_PORT + 5
BOUND_S = 10.0  # the deployment's EPISTREAM_READ_AFTER_TIMEOUT_S: room for a rebalance on a busy machine
GAP_GRACE_S = 2.0  # the deployment's EPISTREAM_WATERMARK_GAP_GRACE_S: a gap is looked at well within the bound
T0 = datetime(2024, 5, 6, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def workers(kafka) -> Iterator[Scripted]:
    with scripted_worker(kafka, no_model_call, metrics_port=METRICS_PORT, name="ryow", workers=("ingest", "answer"),
                         overrides={"read_after_timeout_s": BOUND_S,
                                    "watermark_gap_grace_s": GAP_GRACE_S}) as running:
        yield running


@pytest.fixture
def tenant() -> str:
    return f"ryow-{uuid.uuid4().hex[:8]}"


def _turn(tenant: str, conversation: str, n: int) -> Turn:
    return own_turn(tenant, conversation, n, t0=T0)


def _remember_and_recall(workers: Scripted, turn: Turn) -> tuple[dict[str, Position], MemoryContext, float]:
    """Produce one turn, then at once read context for its own words, waiting for its position."""

    async def go() -> tuple[dict[str, Position], MemoryContext, float]:
        positions = await produce_turns(workers.settings, [turn])
        return (positions, *await recall(workers.settings, turn, positions, bound_s=BOUND_S))

    return asyncio.run(go())


def _answer_metric(name: str, **labels: str) -> float:
    return sample_sum(read_samples(f"http://127.0.0.1:{METRICS_PORT + PORT_OFFSET['answer']}/metrics"), name, **labels)


def test_a_read_right_after_a_produce_contains_the_produced_turn_100_times_of_100(workers, tenant):
    missed: list[str] = []
    for n in range(100):
        turn = _turn(tenant, f"c{n % 7}", n)  # seven conversations: their partitions vary
        positions, reply, _ = _remember_and_recall(workers, turn)
        assert set(positions) == {turn.conversation_id} and reply.error is None
        assert reply.incomplete is None, reply.incomplete
        if not holds(reply, turn):
            missed.append(turn.turn_id)
    assert missed == []
    assert _answer_metric("epistream_answer_read_after_wait_seconds_count", outcome="stored") >= 100


def test_with_ingest_stopped_a_read_gives_up_at_its_bound_and_says_it_is_incomplete(workers, tenant):
    before = _answer_metric("epistream_answer_reads_incomplete_total")
    workers.processes["ingest"].stop()
    try:
        turn = _turn(tenant, "stopped", 1)
        positions, reply, waited = _remember_and_recall(workers, turn)
        position = positions["stopped"]
        assert reply.error is None and not holds(reply, turn)
        assert reply.incomplete == (f"not stored within {BOUND_S:g}s: stopped@{position.partition}:{position.offset}; "
                                    "the read may miss those turns")
        assert waited >= BOUND_S  # it did wait its bound before reading
        assert _answer_metric("epistream_answer_reads_incomplete_total") == before + 1
    finally:
        assert workers.deployment is not None
        workers.processes["ingest"] = workers.deployment.run("ingest", METRICS_PORT + PORT_OFFSET["ingest"])
    # The restarted worker stores the turn: the same read is now complete and holds it.
    wait_for(lambda: workers.deployment is not None and workers.deployment.turns(tenant, "stopped") == 1,
             timeout=120, what="the turn stored after the restart")
    reply, _ = recall_now(workers.settings, turn, positions, bound_s=BOUND_S)
    assert reply.incomplete is None and holds(reply, turn)


def test_positions_nothing_was_produced_at_are_named_not_waited_for_to_the_bound(workers, tenant):
    """A position on a partition the turns topic lacks, or far past its partition's end, can never be
    stored: the reply says so, and the read does not spend its bound waiting for it."""
    before = _answer_metric("epistream_answer_reads_incomplete_total")
    turn = _turn(tenant, "real", 1)
    positions = asyncio.run(produce_turns(workers.settings, [turn]))
    asked = [Position(conversation_id="ghost", partition=99, offset=0),
             Position(conversation_id="far", partition=0, offset=10**12), positions["real"]]

    async def go() -> tuple[MemoryContext, float]:
        started = time.monotonic()
        reply = await context(workers.settings, tenant=tenant, question=turn.text, budget_tokens=200, after=asked,
                              timeout_s=BOUND_S + 60)
        return reply, time.monotonic() - started

    reply, waited = asyncio.run(go())
    topic = workers.settings.topic_turns
    assert reply.error is None and holds(reply, turn)  # the real position was waited for and read
    assert reply.incomplete is not None and re.fullmatch(
        rf"never produced to {re.escape(topic)}: ghost@99:0 \(no partition 99\), far@0:1000000000000 "
        r"\(partition 0 ends at \d+\); not waited for", reply.incomplete), reply.incomplete
    assert waited < BOUND_S  # named at once: the bound was not spent on them
    assert _answer_metric("epistream_answer_reads_incomplete_total") == before + 1


def _ingest_metric(name: str, **labels: str) -> float:
    return sample_sum(read_samples(f"http://127.0.0.1:{METRICS_PORT + PORT_OFFSET['ingest']}/metrics"), name, **labels)


def test_a_third_partys_transaction_marker_holds_the_mark_only_until_the_log_shows_it_empty(workers, tenant):
    """A transactional producer (kafka-python) writes a turn to the turns topic: its commit marker takes an
    offset no consumer is given, so the real ingest worker stores the turns on both sides of it and the
    mark stops below the marker. The worker's tick reads that gap from the log, finds only the marker and
    fills it: a read after the next turn is complete and holds both turns."""
    before = _ingest_metric("epistream_watermark_gaps_total", outcome="empty")
    first = _turn(tenant, "tx", 1)
    partition = asyncio.run(produce_turns(workers.settings, [first]))["tx"].partition
    in_transaction = _turn(tenant, "tx", 2)
    producer = KafkaProducer(bootstrap_servers=workers.settings.kafka_bootstrap,
                             transactional_id=f"third-party-{uuid.uuid4().hex[:6]}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(workers.settings.topic_turns, key=b"tx", value=in_transaction.to_bytes(), partition=partition)
        producer.commit_transaction()
    finally:
        producer.close()
    after = _turn(tenant, "tx", 3)
    positions, reply, _ = _remember_and_recall(workers, after)
    assert positions["tx"].partition == partition
    assert reply.error is None and reply.incomplete is None, reply.incomplete
    assert holds(reply, after)
    assert _ingest_metric("epistream_watermark_gaps_total", outcome="empty") >= before + 1
    assert _ingest_metric("epistream_watermark_gaps_total", outcome="skipped") == 0


def _second_ingest_worker(workers: Scripted) -> ManagedProcess:
    """Another ingest worker of the same deployment and consumer group: the group rebalances."""
    assert workers.deployment is not None
    process = ManagedProcess(f"worker-ingest-ryow-second-{uuid.uuid4().hex[:6]}", workers.settings.state_dir)
    process.spawn(worker_argv("ingest"), env=workers.deployment.env | {
        "EPISTREAM_INGEST_METRICS_PORT": str(SECOND_INGEST_PORT)})
    return process


def _stored_by(port: int) -> float:
    """Turns an ingest worker has written, from its /metrics (0 while it is not serving yet)."""
    try:
        return sample_sum(read_samples(f"http://127.0.0.1:{port}/metrics"), "epistream_ingest_turns_total")
    except OSError:
        return 0.0


def test_a_rebalance_mid_stream_never_makes_a_read_silently_stale(workers, tenant):
    """While turns and reads stream, a second ingest worker joins the group (the stream goes on until it
    has stored turns of partitions it took over), then the first one leaves (the stream goes on while it
    stops): each read holds its turn, or says it is incomplete, never a complete reply without it; once
    the newcomer holds every partition, every read holds its turn again."""
    second = _second_ingest_worker(workers)
    first = workers.processes["ingest"]
    rounds: list[tuple[bool, bool]] = []  # (complete, contains)

    def stream_round() -> None:
        n = len(rounds)
        turn = _turn(tenant, f"r{n % 11}", n)  # eleven conversations over the six partitions
        _, reply, _ = _remember_and_recall(workers, turn)
        assert reply.error is None
        rounds.append((reply.incomplete is None, holds(reply, turn)))

    try:
        while _stored_by(SECOND_INGEST_PORT) == 0:
            assert len(rounds) < 400, f"the second ingest worker stored nothing: {second.log_file}"
            stream_round()
        joined = len(rounds)
        leaving = threading.Thread(target=first.stop)
        leaving.start()
        for _ in range(20):
            stream_round()
        leaving.join()
        stale = [n for n, (complete, contains) in enumerate(rounds) if complete and not contains]
        assert stale == [] and joined > 0
        for n in range(10):
            turn = _turn(tenant, f"s{n}", 1000 + n)
            _, reply, _ = _remember_and_recall(workers, turn)
            assert reply.incomplete is None and holds(reply, turn)
    finally:
        second.stop()
        assert workers.deployment is not None
        workers.processes["ingest"] = workers.deployment.run("ingest", METRICS_PORT + PORT_OFFSET["ingest"])
    # Seen with -s: how far the stream went before the newcomer stored, how many reads gave up at their bound.
    print(json.dumps({"joined_at_round": joined, "rounds": len(rounds),
                      "incomplete": sum(not c for c, _ in rounds)}), file=sys.stderr)


def test_the_cli_prints_the_positions_it_produced_and_context_reads_after_them(workers, tenant, tmp_path):
    assert workers.deployment is not None
    turns = [_turn(tenant, "cli-a", 1), _turn(tenant, "cli-b", 2), _turn(tenant, "cli-a", 3)]
    path = tmp_path / "turns.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in turns))
    produced = workers.deployment.cli("produce", str(path))
    assert produced.returncode == 0, produced.stderr
    printed = sorted(line.split()[1] for line in produced.stdout.splitlines() if line.startswith("--after "))
    assert [p.split("@")[0] for p in printed] == ["cli-a", "cli-b"]  # one per conversation: its last turn
    read = workers.deployment.cli("context", turns[2].text, "--tenant", tenant, "--conversation", "cli-a",
                                  "--budget", "200", "--json", "--no-check", *(f"--after={p}" for p in printed))
    assert read.returncode == 0, read.stderr
    reply = MemoryContext.model_validate_json(read.stdout)
    assert reply.incomplete is None and holds(reply, turns[2])
