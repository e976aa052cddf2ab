"""Progress of answering, for the askers that asked (`Question.progress`): each step a mode takes
becomes a `Progress` record on the question's reply topic and partition, before the reply.

Progress is informational and best effort, kept apart from the reply's exactly-once path: a mode
reports a step without waiting (`Steps.report` only queues it); one producer per worker, not
transactional and not in any reply's transaction, sends the queue in the background; a full queue,
a broker hiccup or a stop loses records, never delays or endangers a reply. The records are keyed
`progress_key(question_id)` and carry the `epistream-record: progress` header, so no reader that
matches replies by question id takes one for a reply (docs/contracts.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer

from epistream.contracts.base import RECORD_HEADER
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import PROGRESS_RECORD, Progress, ProgressStep, progress_key
from epistream.messaging.kafka_io import Outgoing, create_producer
from epistream.settings.processes import Settings

log = logging.getLogger(__name__)

#: Records waiting to be sent, across the worker's questions; past it new ones are dropped.
QUEUE_MAX = 1_000
#: How long a send may wait for the reply topic's metadata, and a stop for what is still queued.
SEND_TIMEOUT_MS = 5_000
STOP_TIMEOUT_S = 2.0


class Steps:
    """The steps of answering one question, reported as its asker asked: `Progress` records handed to a
    sink that never blocks; nothing at all for a question that did not ask (or before `aim`)."""

    def __init__(self, question_id: str, mode: Mode, sink: Callable[[Outgoing], None] | None) -> None:
        self._question_id = question_id
        self._sink = sink
        self._mode = mode
        self._seq = 0  # across the question's attempts: a retried answer keeps counting up
        self._target: tuple[str, int | None] | None = None

    @classmethod
    def of(cls, question: Question, sink: Callable[[Outgoing], None] | None) -> Steps:
        """The question's steps: reported to `sink` where it asked for progress, else nowhere."""
        return cls(question.question_id, question.mode, sink if question.progress else None)

    @classmethod
    def none(cls) -> Steps:
        return cls("", Mode.AUTO, None)

    def aim(self, topic: str, partition: int | None) -> None:
        """Where the reply goes: its progress goes there first (by the progress key's hash where the
        question names no partition: then not in order with the reply)."""
        self._target = (topic, partition)

    def started(self, mode: Mode) -> None:
        """Answering began in `mode` (auto's choice); the later steps name it."""
        self._mode = mode
        self.report(ProgressStep.MODE)

    def report(self, step: ProgressStep, *, done: int | None = None, total: int | None = None,
               tool: str | None = None) -> None:
        if self._sink is None or self._target is None:
            return
        try:
            record = Progress(question_id=self._question_id, seq=self._seq + 1, step=step, mode=self._mode, done=done,
                              total=total, tool=tool)
        except ValueError as exc:  # a step that does not fit its contract is ours to fix, never the answer's end
            log.warning("progress of %s not sent: %s", self._question_id, exc)
            return
        self._seq += 1
        topic, partition = self._target
        self._sink(Outgoing(topic, progress_key(self._question_id), record.to_bytes(), partition))


class ProgressSink:
    """The worker's one progress producer (plain: acks=1, not idempotent, not transactional), started at
    the first record, and the queue it sends from. `__call__` never blocks; `close` stops both."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._queue: asyncio.Queue[Outgoing] = asyncio.Queue(QUEUE_MAX)
        self._sender: asyncio.Task[None] | None = None
        self.dropped = 0

    def __call__(self, record: Outgoing) -> None:
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self.dropped += 1
            return
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="epistream-progress")

    async def _send(self) -> None:
        producer = create_producer(self._settings, acks=1, enable_idempotence=False, linger_ms=0,
                                   request_timeout_ms=SEND_TIMEOUT_MS)
        try:
            try:
                await producer.start()
            except Exception as exc:  # the broker is unreachable: what is queued now is lost, the next record retries
                log.warning("progress producer could not start (%s): %d progress record(s) dropped", exc,
                            self._queue.qsize())
                self._drain()
                return
            while True:
                record = await self._queue.get()
                await self._produce(producer, record)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), STOP_TIMEOUT_S)  # sends what it holds, or gives up

    async def _produce(self, producer: AIOKafkaProducer, record: Outgoing) -> None:
        try:
            delivery = await producer.send(record.topic, key=record.key, value=record.value,
                                           partition=record.partition, headers=[(RECORD_HEADER, PROGRESS_RECORD)])
        except Exception as exc:  # no metadata for the topic in time, a partition it lacks: this record is lost
            self.dropped += 1
            log.debug("progress record to %s not sent: %s", record.topic, exc)
            return
        delivery.add_done_callback(self._delivered)

    def _delivered(self, delivery: asyncio.Future[object]) -> None:
        if not delivery.cancelled() and delivery.exception() is not None:
            self.dropped += 1
            log.debug("progress record lost: %s", delivery.exception())

    def _drain(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()
            self.dropped += 1

    async def close(self) -> None:
        """Stop sending: what the producer holds gets `STOP_TIMEOUT_S` to go, the rest of the queue is dropped."""
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        self._drain()
