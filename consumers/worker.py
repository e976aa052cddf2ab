"""The answer consumer: `memory.questions` in, replies out (`memory.answers`, or the asked reply topic),
many questions at once.

Each question is read or answered in a slot of its lane (consumers/lanes.py: no-model reads apart from
model calls), its read-after wait holding none. Its reply (a failed one when answering failed, with its
dead letter beside it) is published as soon as it is ready, in a transaction that also commits the
group's offset of its partition: the partition's first question not yet published, the ones past it
already published named in the commit's metadata (consumers/commit_window.py). A crash or a lost
partition aborts the open transaction; the next owner starts at the committed offset, skips the
questions the metadata names, and answers the rest once: a read_committed reader sees every reply
exactly once, and a read never waits for a model call before it (docs/design.md#the-answer-worker).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from epistream.contracts.questions import is_withdrawal
from epistream.core import tracing
from epistream.core.claims import ClaimCheck
from epistream.core.metrics import Metrics
from epistream.core.retry import BLOCKING
from epistream.messaging.kafka_io import (
    PartitionProducers,
    TopicDirectory,
    create_admin,
    create_consumer,
    publish_transaction,
    report_lag,
    topic_partitions,
    worker_client_id,
)
from epistream.messaging.log_ends import LogEnds
from epistream.ops.resources import Resources
from epistream.settings.processes import Settings

from .assistants import AssistantPool
from .commit_window import MAX_SPAN, CommitWindow, decode_done
from .deps import AnswerDeps
from .lanes import Lanes
from .outcome import Outcome, mode_of, outcome_of, withdrawal_outcome
from .progress import ProgressSink
from .retrieval import from_settings
from .withdrawals import Withdrawable, Withdrawals

log = logging.getLogger(__name__)

#: Longest a fetch waits when nothing arrives: how soon a paused partition resumes, or a stop is seen.
FETCH_WAIT_MS = 100
#: Most records one fetch returns (the in-flight bound, not this, limits the work taken on).
FETCH_MAX_RECORDS = 64
#: Longest a lost partition's transaction in progress is awaited before its producer is closed.
PUBLISH_GRACE_S = 10.0


@dataclass
class OwnedPartition:
    """A partition this worker answers: its window of offsets, its transactional producer, the tasks
    answering its questions, and its one transaction at a time."""

    window: CommitWindow[Outcome]
    producer: AIOKafkaProducer
    answering: set[asyncio.Task[None]] = field(default_factory=set)
    withdrawals: Withdrawals = field(default_factory=Withdrawals)
    publishing: asyncio.Task[None] | None = None


class AnswerLoop(ConsumerRebalanceListener):
    """The consumer, one transactional producer per owned partition, the lanes, the topics directory,
    and the claim check built once for the worker."""

    def __init__(self, deps: AnswerDeps, consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient, stop: asyncio.Event,
                 claims: ClaimCheck) -> None:
        settings = deps.settings
        self.deps = deps
        self.claims = claims
        self.consumer = consumer
        self.admin = admin
        self.stop = stop
        self.group = settings.answer_group
        self.max_in_flight = settings.answer_max_in_flight
        self.lanes = Lanes(reads=settings.answer_read_concurrency, model=settings.answer_model_concurrency,
                           metrics=deps.metrics)
        self.producers = PartitionProducers(settings, self.group)
        self.progress = ProgressSink(settings)  # steps for the askers that asked, outside every transaction

        async def list_partitions(topic: str) -> list[int]:
            return (await topic_partitions(admin, [topic])).get(topic, [])

        self.topics = TopicDirectory(consumer.topics, list_partitions=list_partitions)
        self.owned: dict[TopicPartition, OwnedPartition] = {}
        self.failures: dict[TopicPartition, int] = {}  # consecutive failed publications per partition
        self.backing_off: dict[TopicPartition, float] = {}  # paused after a failure, until (monotonic)

    # -- the loop: fetch, hand each record to a task, keep the fetching inside the bounds --

    async def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._pause_or_resume()
                batches = await self.consumer.getmany(timeout_ms=FETCH_WAIT_MS, max_records=FETCH_MAX_RECORDS)
                for tp, records in batches.items():
                    await self._take(TopicPartition(tp.topic, tp.partition), records)
        finally:
            await self._close()

    def _pause_or_resume(self) -> None:
        """Pause the partitions backing off after a failure, those whose window is full, and every one
        while the worker holds `answer_max_in_flight` questions; resume the rest. The loop keeps
        fetching either way, so the worker stays well inside its poll interval."""
        now = time.monotonic()
        self.backing_off = {tp: until for tp, until in self.backing_off.items() if until > now}
        assigned = self.consumer.assignment()
        full = sum(p.window.in_flight for p in self.owned.values()) >= self.max_in_flight
        wanted = set(assigned) if full else (
            set(self.backing_off) | {tp for tp, p in self.owned.items() if p.window.span >= MAX_SPAN})
        wanted &= assigned
        paused = self.consumer.paused()
        if wanted - paused:
            self.consumer.pause(*(wanted - paused))
        if (paused & assigned) - wanted:
            self.consumer.resume(*((paused & assigned) - wanted))

    async def _take(self, tp: TopicPartition, records: list[ConsumerRecord]) -> None:
        if tp in self.backing_off or tp not in self.consumer.assignment():
            return  # fetched before a failure moved the position back, or before the partition went
        owned = self.owned.get(tp)
        if owned is None:
            try:
                owned = await self._own(tp)
            except Exception as exc:  # the broker is unreachable: nothing was read for good, try again
                self._back_off(tp, records[0].offset, exc)
                return
            if records[0].offset > owned.window.start:  # this consumer is past the commit point: go back
                log.info("%s: resuming at the committed offset %d, not %d", tp, owned.window.start, records[0].offset)
                self.consumer.seek(tp, owned.window.start)
                return
        for record in records:
            if owned.window.skips(record.offset):  # published before (the commit's metadata says), or behind
                owned.window.seen(record.offset)
                continue
            owned.window.begin(record.offset)
            if is_withdrawal(record.headers):  # in order after its question: it stops that question's task
                self._finish(tp, owned, record.offset, await withdrawal_outcome(record, owned.withdrawals, self.deps,
                                                                                claims=self.claims))
                continue
            withdrawable = owned.withdrawals.open(record.key)
            task = asyncio.create_task(self._answer(tp, owned, record, withdrawable),
                                       name=f"answer {tp.partition}@{record.offset}")
            owned.answering.add(task)
            task.add_done_callback(owned.answering.discard)

    async def _own(self, tp: TopicPartition) -> OwnedPartition:
        """Start the partition's producer (which settles the previous owner's transaction: fences it,
        then its commit or abort is final), then read where the partition stands: the committed offset
        (not before the log's start) and the questions past it already published."""
        producer, _ = await self.producers.for_partition(tp)
        committed = (await self.admin.list_consumer_group_offsets(self.group, partitions=[tp])).get(tp)
        log_start = (await self.consumer.beginning_offsets([tp]))[tp]
        at = committed.offset if committed is not None and committed.offset >= 0 else log_start
        done = decode_done(at, committed.metadata if committed is not None else None)
        owned = OwnedPartition(CommitWindow(max(at, log_start), done), producer)
        self.owned[tp] = owned
        return owned

    # -- one question: answered in its task, then published with whatever else is ready --

    async def _answer(self, tp: TopicPartition, owned: OwnedPartition, record: ConsumerRecord,
                      withdrawable: Withdrawable) -> None:
        try:
            await self._answer_once(tp, owned, record, withdrawable)
        finally:
            owned.withdrawals.close(record.key, withdrawable)

    async def _answer_once(self, tp: TopicPartition, owned: OwnedPartition, record: ConsumerRecord,
                           withdrawable: Withdrawable) -> None:
        try:
            # One record, one process span (the child of the question's send, messaging conventions).
            with tracing.span(f"process {record.topic}", kind="consumer", parent=tracing.extract(record.headers),
                              attributes=tracing.messaging("process", "process", record.topic,
                                                           partition=record.partition, offset=record.offset,
                                                           group=self.group)):
                outcome = await outcome_of(record, self.deps, self.topics, claims=self.claims,
                                           give_up=lambda: not self._still_owns(tp, owned), slot=self.lanes.slot,
                                           progress=self.progress, withdrawable=withdrawable)
                if outcome is not None and outcome.answer is not None:  # in the question's trace (its log line)
                    log.info("answered %s (%s, %.0f ms)", outcome.answer.question_id, mode_of(outcome.answer),
                             outcome.answer.latency_ms)
        except Exception as exc:  # outcome_of answers every failure itself: this is a bug of ours
            log.exception("answering %s[%d]@%d failed outside the question's policy", tp.topic, tp.partition,
                          record.offset)
            if self._still_owns(tp, owned):  # its offset would stay open for good: read the partition again
                await self._release(tp, cancel_publishing=False)
                self._back_off(tp, owned.window.start, exc)
            return
        if outcome is None:
            return  # stopping, or the partition moved on: its next owner answers the question once
        self._finish(tp, owned, record.offset, outcome)

    def _finish(self, tp: TopicPartition, owned: OwnedPartition, offset: int, outcome: Outcome) -> None:
        """A record's outcome is ready: into the window, published with whatever else is ready."""
        if not self._still_owns(tp, owned):
            return  # stopping, or the partition moved on: its next owner handles the record once
        owned.window.finish(offset, outcome)
        if owned.publishing is None or owned.publishing.done():
            owned.publishing = asyncio.create_task(self._publish(tp, owned), name=f"publish {tp.partition}")

    def _still_owns(self, tp: TopicPartition, owned: OwnedPartition) -> bool:
        return not self.stop.is_set() and self.owned.get(tp) is owned

    async def _publish(self, tp: TopicPartition, owned: OwnedPartition) -> None:
        """Publish the partition's ready replies, one transaction at a time, each with all that is ready."""
        while (batch := owned.window.take()) is not None:
            started = time.perf_counter()
            try:
                await publish_transaction(owned.producer, [m for _, o in batch.items for m in o.messages],
                                          consumed=tp, next_offset=batch.commit_offset, metadata=batch.metadata,
                                          group=self.group)
            except Exception as exc:
                if self.owned.get(tp) is owned:
                    await self._release(tp, cancel_publishing=False)
                    self._back_off(tp, owned.window.start, exc)
                return
            self.deps.metrics.answer_publish_seconds.observe(time.perf_counter() - started)
            owned.window.committed(batch)
            self.failures.pop(tp, None)
            log.debug("%s: published %d replies, committed through %d", tp, len(batch.items), batch.commit_offset)

    # -- losing a partition, failing, stopping --

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Before a rebalance gives partitions away: stop answering them, let a transaction in progress
        end, close their producers. The next owner's producer fences anything left."""
        for tp in revoked:
            await self._release(TopicPartition(tp.topic, tp.partition), cancel_publishing=False)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Nothing to do: a partition is taken over at its first record (`_own`)."""

    async def _release(self, tp: TopicPartition, *, cancel_publishing: bool) -> None:
        owned = self.owned.pop(tp, None)
        if owned is None:
            return
        for task in owned.answering:
            if task is not asyncio.current_task():  # a task releasing its own partition finishes the release
                task.cancel()
        publishing = owned.publishing
        if publishing is not None and publishing is not asyncio.current_task() and not publishing.done():
            if cancel_publishing:
                publishing.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(publishing), timeout=PUBLISH_GRACE_S)
            except (TimeoutError, asyncio.CancelledError):
                pass
        await self.producers.drop(tp)

    def _back_off(self, tp: TopicPartition, offset: int, exc: Exception) -> None:
        """The transaction was aborted (fenced by a new owner, a broker hiccup, a topic gone) or the
        producer could not start: read the partition again from `offset` after a growing pause. A new
        producer fences any other owner and resumes from the committed offset."""
        log.warning("publishing %s[%d] failed (%s: %s); it is read again from %d", tp.topic, tp.partition,
                    type(exc).__name__, exc, offset)
        self.topics.invalidate()
        self.failures[tp] = self.failures.get(tp, 0) + 1
        self.backing_off[tp] = time.monotonic() + BLOCKING.delay(self.failures[tp])
        if tp in self.consumer.assignment():
            self.consumer.seek(tp, offset)

    async def _close(self) -> None:
        """Stopping: cancel what is being answered (uncommitted, it is answered by the next owner), let
        the transactions in progress end, close the producers."""
        for tp in list(self.owned):
            await self._release(tp, cancel_publishing=False)
        await self.producers.close()
        await self.progress.close()


async def run(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    shared = await Resources.open(settings)
    metrics = shared.metrics
    assistants = AssistantPool(shared.assistants(), concurrency=settings.assistant_concurrency,
                               max_tokens=settings.assistant_max_tokens)
    turns_log = LogEnds(settings, settings.topic_turns)
    await turns_log.start()
    deps = AnswerDeps(settings=settings, pool=shared.pool, embedder=shared.embedder, master=shared.model("master"),
                      metrics=metrics, assistants=assistants, recipes=from_settings(settings), turns_log=turns_log,
                      read_pool=shared.read_pool)
    claims = ClaimCheck.from_settings(settings)  # once per worker, not per question (as ingest does)
    consumer = create_consumer(
        settings,
        group_id=settings.answer_group,
        client_id=worker_client_id("answer"),
        enable_auto_commit=False,  # offsets are committed inside each question's transaction
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        fetch_max_wait_ms=FETCH_WAIT_MS,  # a resumed partition is fetched again within it
        # The loop never waits for an answer (each runs in its own task): the default interval is ample.
        max_poll_interval_ms=300_000,
        session_timeout_ms=int(settings.kafka_session_timeout_s * 1000),
        heartbeat_interval_ms=int(settings.kafka_heartbeat_interval_s * 1000),
    )
    admin = create_admin(settings)  # the committed offsets' metadata, the reply topics' partitions
    loop = AnswerLoop(deps, consumer, admin, stop, claims)
    consumer.subscribe([settings.topic_questions], listener=loop)
    lag_task: asyncio.Task[None] | None = None
    try:
        await admin.start()
        await consumer.start()
        metrics.serve(settings.answer_metrics_port, host=settings.metrics_host)
        log.info("answer consumer ready; metrics on :%d", settings.answer_metrics_port)
        lag_task = asyncio.create_task(_report_lag(settings, metrics, stop))
        await loop.run()
    finally:
        if lag_task is not None:
            lag_task.cancel()
        await consumer.stop()
        await admin.close()
        await turns_log.close()
        await shared.close()


async def _report_lag(settings: Settings, metrics: Metrics, stop: asyncio.Event, every_s: float = 5.0) -> None:
    while not stop.is_set():
        await report_lag(settings, metrics, settings.answer_group, [settings.topic_questions])
        await asyncio.sleep(every_s)


def run_worker(settings: Settings) -> None:
    """Run the answer consumer until SIGTERM or SIGINT (blocks)."""
    tracing.setup("epistream-answer", texts=settings.trace_texts)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(settings, stop=stop)

    try:
        asyncio.run(main())
    finally:
        tracing.shutdown()
