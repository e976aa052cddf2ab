"""The ingest agent's acknowledgement rule (issue 11, defects 1 and 2), held by its Checkpoint: a record
is acknowledged only after it is stored or dead-lettered with its reason; a step that fails or is
cancelled (SIGTERM while storing waits) acknowledges nothing; a failing housekeeping tick is logged,
counted and the next one runs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
import pytest
from aiokafka.errors import KafkaConnectionError

from epistream.contracts.dead_letters import DeadLetter
from epistream.core.metrics import Metrics
from epistream.core.retry import Backoff
from epistream.errors import ContractError
from epistream.pipeline.checkpoint import Checkpoint
from epistream.pipeline.housekeeping import guarded
from epistream.pipeline.ingest import IngestResult, Rejected
from epistream.pipeline.records import RawRecord

QUICK = Backoff(first_s=0.001, cap_s=0.001)


@dataclass(frozen=True)
class Event:
    record: RawRecord


def events(n: int) -> list[Event]:
    return [Event(RawRecord("memory.turns", 0, i, b"c", b"{}")) for i in range(n)]


class Log:
    def __init__(self) -> None:
        self.steps: list[tuple[str, object]] = []

    async def ack(self, event: Event) -> None:
        self.steps.append(("ack", event.record.offset))

    async def send_dead(self, key: bytes | None, value: bytes) -> None:
        self.steps.append(("dead", DeadLetter.model_validate_json(value).offset))

    async def publish(self, closed) -> None:  # type: ignore[no-untyped-def]
        self.steps.append(("publish", tuple(closed)))


class Steps(Log):
    """Every collaborator of the checkpoint written down, the store's call included; a step named in
    `fail` raises instead."""

    def __init__(self, result: IngestResult, fail: dict[str, Exception] | None = None) -> None:
        super().__init__()
        self.result, self.fail = result, fail or {}

    def _step(self, name: str, what: object) -> None:
        if name in self.fail:
            raise self.fail[name]
        self.steps.append((name, what))

    async def store(self, records: Sequence[RawRecord]) -> IngestResult:
        self._step("store", tuple(r.offset for r in records))
        return self.result

    async def send_dead(self, key: bytes | None, value: bytes) -> None:
        letter = DeadLetter.model_validate_json(value)
        self._step("dead", (letter.offset, letter.stage, letter.error_class, letter.error_message))

    async def publish(self, closed) -> None:  # type: ignore[no-untyped-def]
        self._step("publish", tuple(closed))

    async def ack(self, event: Event) -> None:
        self._step("ack", event.record.offset)


def checkpoint(ingest, log: Log, send_dead=None) -> Checkpoint[Event]:  # type: ignore[no-untyped-def]
    return Checkpoint(to_record=lambda e: e.record, store=ingest, send_dead=send_dead or log.send_dead,
                      publish=log.publish, ack=log.ack, metrics=Metrics.create(), backoff=QUICK)


def run_settle(batch: list[Event], ingest, log: Log, send_dead=None) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(checkpoint(ingest, log, send_dead).store_then_ack(batch))


def test_events_are_acked_only_after_their_letters_are_sent_and_segments_published():
    log = Log()
    batch = events(3)

    async def ingest(records):  # type: ignore[no-untyped-def]
        return IngestResult(dead=[Rejected(records[1], ContractError("bad"))], closed_segments=[("t", "c#0000")])

    run_settle(batch, ingest, log)
    assert log.steps == [("dead", 1), ("publish", (("t", "c#0000"),)), ("ack", 0), ("ack", 1), ("ack", 2)]


def test_a_cancel_while_storing_waits_acks_nothing():
    log = Log()
    started = asyncio.Event()

    async def ingest(records):  # type: ignore[no-untyped-def]
        started.set()
        await asyncio.sleep(3600)  # PostgreSQL is down: the store retries

    async def scenario() -> None:
        task = asyncio.ensure_future(checkpoint(ingest, log).store_then_ack(events(4)))
        await started.wait()
        task.cancel()  # what Faust does to the agent on SIGTERM
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert log.steps == []


def test_a_letter_the_broker_cannot_take_yet_is_retried_before_anything_is_acked():
    log, failures = Log(), [KafkaConnectionError("broker away"), KafkaConnectionError("still away")]

    async def flaky_send(key: bytes | None, value: bytes) -> None:
        if failures:
            raise failures.pop(0)
        await log.send_dead(key, value)

    async def ingest(records):  # type: ignore[no-untyped-def]
        return IngestResult(dead=[Rejected(records[0], ContractError("bad"))])

    run_settle(events(1), ingest, log, send_dead=flaky_send)
    assert log.steps == [("dead", 0), ("ack", 0)]


def test_the_batch_is_stored_before_any_of_it_is_acknowledged():
    steps = Steps(IngestResult())
    run_settle(events(3), steps.store, steps)
    assert steps.steps == [("store", (0, 1, 2)), ("ack", 0), ("ack", 1), ("ack", 2)]


def test_each_record_set_aside_is_dead_lettered_with_its_reason_before_any_ack():
    batch = events(3)
    steps = Steps(IngestResult(dead=[Rejected(batch[2].record, ContractError("no text")),
                                     Rejected(batch[0].record, ValueError("bad tenant"))]))
    run_settle(batch, steps.store, steps)
    assert steps.steps == [("store", (0, 1, 2)), ("dead", (2, "ingest", "ContractError", "no text")),
                           ("dead", (0, "ingest", "ValueError", "bad tenant")), ("ack", 0), ("ack", 1), ("ack", 2)]


@pytest.mark.parametrize("failing", ["store", "dead", "publish"])
def test_a_step_that_fails_leaves_the_whole_batch_unacknowledged(failing: str):
    batch = events(2)
    result = IngestResult(dead=[Rejected(batch[1].record, ContractError("bad"))], closed_segments=[("t", "c#0000")])
    # Not transient: nothing waits it out, it is raised (and the agent's batch read again).
    steps = Steps(result, fail={failing: RuntimeError(f"{failing} failed")})
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        run_settle(batch, steps.store, steps)
    assert [step for step in steps.steps if step[0] == "ack"] == []


def test_a_cancel_while_a_letter_is_being_delivered_acknowledges_nothing():
    batch = events(2)
    steps, sending = Steps(IngestResult(dead=[Rejected(batch[0].record, ContractError("bad"))])), asyncio.Event()

    async def held_by_the_broker(key: bytes | None, value: bytes) -> None:
        sending.set()
        await asyncio.sleep(3600)

    async def scenario() -> None:
        task = asyncio.ensure_future(checkpoint(steps.store, steps, held_by_the_broker).store_then_ack(batch))
        await sending.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert steps.steps == [("store", (0, 1))]


def test_a_failing_housekeeping_tick_is_logged_counted_and_does_not_stop_the_next(caplog):
    metrics, calls = Metrics.create(), []

    async def tick() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    async def twice() -> list[bool]:
        return [await guarded("housekeeping", tick, metrics), await guarded("housekeeping", tick, metrics)]

    assert asyncio.run(twice()) == [False, True]
    assert metrics.registry.get_sample_value("epistream_task_failures_total",
                                             {"task": "housekeeping", "error_class": "OperationalError"}) == 1.0
    assert "housekeeping failed" in caplog.text and "OperationalError" in caplog.text
