"""Records a Faust consumer fetched and dropped come again (pipeline/redelivery.py), on the real broker:
a worker that drops each record's first delivery, as Faust can around a rebalance, handles every
record once its stall guard sought the partitions back to their committed offsets; one that drops
every delivery ends its process (for its supervisor to start afresh) once the seek brought nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid

import pytest
from aiokafka import TopicPartition
from aiokafka.admin.records_to_delete import RecordsToDelete
from kafka import KafkaProducer

from epistream.messaging.kafka_io import create_admin, partition_lag
from epistream.messaging.topics import create_topic
from epistream.pipeline.redelivery import EXIT_STALLED

pytestmark = pytest.mark.integration

STALL_S = 5.0
RECORDS = [f"record {n}" for n in range(6)]


def _start(kafka, tmp_path, *mode: str) -> tuple[subprocess.Popen, str, str]:  # type: ignore[no-untyped-def]
    """A dropping worker on a fresh two-partition topic holding RECORDS: (process, topic, group)."""
    run = uuid.uuid4().hex[:8]
    topic, group = f"redeliver-{run}", f"redeliver-group-{run}"
    asyncio.run(create_topic(kafka, topic, partitions=2))
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "epistream.testing.dropping_worker", kafka.kafka_bootstrap, topic, group,
             str(tmp_path / "handled.txt"), str(STALL_S), str(tmp_path / "home"), *mode],
            stdout=log, stderr=subprocess.STDOUT)
    producer = KafkaProducer(bootstrap_servers=kafka.kafka_bootstrap)
    try:
        for n, value in enumerate(RECORDS):
            producer.send(topic, value=value.encode(), partition=n % 2).get(timeout=30)
    finally:
        producer.close()
    return worker, topic, group


def test_records_dropped_by_the_consumer_are_fetched_again_and_handled(kafka, tmp_path):
    handled, log_path = tmp_path / "handled.txt", tmp_path / "worker.log"
    worker, topic, group = _start(kafka, tmp_path)
    try:
        _wait_handled(worker, handled, log_path)
        # Each handled once, and the group's committed offsets reach the end: nothing left behind.
        assert sorted(_lines(handled)) == sorted(RECORDS)
        deadline = time.monotonic() + 30
        while any(done < end for done, end in asyncio.run(partition_lag(kafka, group, [topic])).values()):
            assert time.monotonic() < deadline, "the committed offsets never reached the end"
            time.sleep(0.5)
        assert "seeking back to the committed offsets" in log_path.read_text()
    finally:
        _stop(worker)


def test_a_consumer_the_seek_cannot_help_ends_its_process_for_a_fresh_start(kafka, tmp_path):
    worker, _, _ = _start(kafka, tmp_path, "always")
    try:
        assert worker.wait(timeout=120) == EXIT_STALLED
    finally:
        _stop(worker)
    log = (tmp_path / "worker.log").read_text()
    assert "seeking back to the committed offsets" in log and "exiting, to be started afresh" in log, log[-3000:]
    assert not (tmp_path / "handled.txt").exists()


def test_a_partition_ending_in_a_transaction_marker_is_caught_up_not_stalled(kafka, tmp_path):
    """A third party's transactional producer wrote the partition's last records: the commit marker
    after them is an offset no consumer is given, so the group's committed offset stays one short of
    the end. The guard asks the log, finds nothing to fetch there, and neither seeks nor exits."""
    run = uuid.uuid4().hex[:8]
    topic, group = f"redeliver-tx-{run}", f"redeliver-tx-group-{run}"
    asyncio.run(create_topic(kafka, topic, partitions=1))
    producer = KafkaProducer(bootstrap_servers=kafka.kafka_bootstrap, transactional_id=f"redeliver-tx-{run}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for value in RECORDS:
            producer.send(topic, value=value.encode(), partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    handled, log_path = tmp_path / "handled.txt", tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "epistream.testing.dropping_worker", kafka.kafka_bootstrap, topic, group,
             str(handled), str(STALL_S), str(tmp_path / "home"), "never"], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_handled(worker, handled, log_path)
        # Idle for four stall periods: long enough for a seek and then an exit, were it called stalled.
        time.sleep(4 * STALL_S + 2)
        assert worker.poll() is None, log_path.read_text()[-3000:]
        assert "verdict" not in log_path.read_text(), log_path.read_text()[-3000:]
        (done, end), = asyncio.run(partition_lag(kafka, group, [topic])).values()
        assert done == end - 1, "the commit marker is the partition's last offset"
    finally:
        _stop(worker)


def _wait_handled(worker: subprocess.Popen, handled, log_path) -> None:  # type: ignore[no-untyped-def,type-arg]
    """Until every record of RECORDS is handled, the worker alive throughout."""
    deadline = time.monotonic() + 120
    while sorted(_lines(handled)) != sorted(RECORDS):
        assert worker.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"handled {_lines(handled)}; log: {log_path.read_text()[-3000:]}"
        time.sleep(0.5)


def _stop(worker: subprocess.Popen) -> None:  # type: ignore[type-arg]
    # Faust's graceful stop waits for the records it holds unacknowledged: a dropped one never is.
    worker.terminate()
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=20)


def _lines(path) -> list[str]:  # type: ignore[no-untyped-def]
    return path.read_text().splitlines() if path.exists() else []


def test_a_group_behind_the_logs_start_stands_at_the_start_not_at_zero(kafka):
    """Retention deleted the records a group never read (or never committed for): the group reads from
    the log's start, so that is where it stands; counted at 0 it would trail forever and its worker
    exit for a fresh start every two minutes (issue 39)."""
    run = uuid.uuid4().hex[:8]
    topic = f"log-start-{run}"
    asyncio.run(create_topic(kafka, topic, partitions=1))
    producer = KafkaProducer(bootstrap_servers=kafka.kafka_bootstrap)
    try:
        for n in range(5):
            producer.send(topic, value=f"old {n}".encode(), partition=0).get(timeout=30)
    finally:
        producer.close()

    async def delete_before(offset: int) -> None:
        admin = create_admin(kafka)
        await admin.start()
        try:
            await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before_offset=offset)})
        finally:
            await admin.close()

    asyncio.run(delete_before(5))  # as retention would: the log now starts at 5
    assert asyncio.run(partition_lag(kafka, f"never-committed-{run}", [topic])) == {(topic, 0): (5, 5)}
