"""The answer consumer: `memory.questions` in, `memory.answers` (or the asked reply topic) out.

A question is answered (an Answer), or, in `context` mode, read (a MemoryContext, no model call).
Every question ends in exactly one committed transaction: its reply (a failed one when answering
failed, with the question's dead letter beside it) and the group's offset past it. Only transient
errors (errors.is_transient: the database or the broker hiccuped) are retried, offset uncommitted;
anything else, ours or not, is a failed answer plus a dead letter, so no question can stop the worker.
A crash or a lost partition aborts the open transaction; the next owner answers the question once,
and read_committed readers never see the aborted answer.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from epistream.contracts.decoding import decode
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import Answer, MemoryContext
from epistream.core import tracing
from epistream.core.claims import ClaimCheck, header_pairs
from epistream.core.metrics import Metrics
from epistream.core.retry import BLOCKING, retry
from epistream.errors import PermanentError, is_transient
from epistream.messaging.dead_letters import DEFAULT_MAX_REQUEST_SIZE, dead_letter, record_size
from epistream.messaging.kafka_io import (
    Outgoing,
    PartitionProducers,
    TopicDirectory,
    create_consumer,
    publish_transaction,
    report_lag,
    worker_client_id,
)
from epistream.messaging.log_ends import LogEnds
from epistream.messaging.tenant_topics import check_own_reply_topic, tenant_reply_topic
from epistream.ops.resources import Resources
from epistream.settings.processes import Settings

from .answer import answer_question, failed_answer
from .assistants import AssistantPool
from .context import failed_context, read_context
from .deps import AnswerDeps
from .listing import read_listing
from .packing import render, used_tokens
from .read_after import read_after
from .retrieval import from_settings

log = logging.getLogger(__name__)

STAGE = "answer"


class UnknownReplyTopic(PermanentError):
    """The question names a reply topic the broker does not have (topics are never auto-created)."""


Reply = Answer | MemoryContext


@dataclass
class Outcome:
    """What one question becomes, published in one transaction: its reply, its dead letter if any."""

    messages: list[Outgoing] = field(default_factory=list)
    answer: Reply | None = None


async def outcome_of(record: ConsumerRecord, deps: AnswerDeps, topics: TopicDirectory, *, claims: ClaimCheck,
                     give_up: Callable[[], bool]) -> Outcome | None:
    """Answer one question record, its tenant claim verified by `claims`; None only when a transient
    failure was still being retried and ``give_up()`` turned true (stopping, or the partition moved):
    the record stays uncommitted."""
    settings = deps.settings
    outcome = Outcome()

    async def letter(key: bytes | None, value: bytes) -> None:
        outcome.messages.append((settings.topic_dlq, key, value))

    try:
        with tracing.span("decode question") as decoding:
            question = decode(record.value, Question, what="memory.questions event")
            tracing.set_attributes(decoding, {"epistream.question_id": question.question_id,
                                              "epistream.mode": question.mode.value})
            tracing.set_text(decoding, "epistream.question", question.question)
            # A claim not proven gets no answer at all: a failed one would still reach the claimed tenant.
            claims.verify(question.tenant, record.value or b"", header_pairs(record.headers))
            fallback = settings.topic_answers
            if claims.enforced:  # each tenant hears back on its own topic only
                fallback = tenant_reply_topic(settings.topic_answers, question.tenant)
                check_own_reply_topic(question.reply_topic, fallback)
                if not await topics.exists(fallback):
                    raise UnknownReplyTopic(f"tenant {question.tenant!r} has no reply topic {fallback!r}: "
                                            "onboard the tenant first")
    except Exception as exc:  # not a question, not proven its tenant's, or nowhere of its tenant's to reply
        await dead_letter(letter, deps.metrics, record, stage=STAGE, error=exc)
        return outcome
    started = time.perf_counter()
    destination = fallback

    async def attempt() -> Reply:
        nonlocal destination
        destination = fallback
        if question.reply_topic is not None:
            if not await topics.exists(question.reply_topic):
                raise UnknownReplyTopic(f"reply_topic {question.reply_topic!r} does not exist; "
                                        f"the failed answer went to {fallback}")
            destination = question.reply_topic
        # Read-your-own-writes: never read before the asked positions are stored, or say so.
        incomplete = None if not question.after else await read_after(
            deps.pool, settings.topic_turns, question.after, timeout_s=settings.read_after_timeout_s,
            metrics=deps.metrics, log=deps.turns_log)
        reply: Reply
        with tracing.span(f"{question.mode.value} question", attributes={"epistream.mode": question.mode.value}):
            if question.listing is not None:  # one conversation's gists or facts, or refused (consumers/listing.py)
                reply = await read_listing(question, deps)
            elif question.mode is Mode.CONTEXT:
                reply = await read_context(question, deps)
            else:
                reply = await answer_question(question, deps)
        return reply.model_copy(update={"incomplete": incomplete}) if incomplete else reply

    def waiting(exc: BaseException, attempt_no: int, delay: float) -> None:
        log.warning("question at %s[%d]@%d failed (%s), retry %d in %.1fs", record.topic, record.partition,
                    record.offset, type(exc).__name__, attempt_no, delay)

    try:
        reply = await retry(attempt, backoff=BLOCKING, on_retry=waiting, stop=give_up)
    except Exception as exc:
        if is_transient(exc):
            return None  # still retryable: only stopping or losing the partition ends the wait
        if not isinstance(exc, PermanentError):  # not an expected refusal: keep the traceback for a fix
            log.exception("question %s failed", question.question_id)
        reply = failed_reply(question, exc, started)
        deps.metrics.questions_answered.labels(mode_of(reply), "failed").inc()
        await dead_letter(letter, deps.metrics, record, stage=STAGE, error=exc)
    key = question.question_id.encode()
    fitted = fit_reply(reply, key)
    outcome.messages.insert(0, (destination, key, fitted.to_bytes()))
    outcome.answer = reply
    return outcome


def failed_reply(question: Question, error: BaseException, started: float) -> Reply:
    if question.mode is Mode.CONTEXT:
        return failed_context(question, error, started)
    return failed_answer(question, error, started)


def mode_of(reply: Reply) -> str:
    return Mode.CONTEXT.value if isinstance(reply, MemoryContext) else reply.mode.value


def _shrink_context(context: MemoryContext) -> MemoryContext | None:
    """A tenth fewer items (at least one), the lowest-ranked first: the reply stays a valid, smaller context."""
    if not context.items:
        return None
    kept = context.items[: max(0, len(context.items) - max(1, len(context.items) // 10))]
    return context.model_copy(update={"items": kept, "text": render(kept),
                                      "used_tokens": used_tokens(kept)})


def _shrink_answer(answer: Answer) -> Answer | None:
    """One evidence item fewer, from the end; with none left, the answer's text halved (with a mark)."""
    if answer.evidence:
        return answer.model_copy(update={"evidence": answer.evidence[:-1]})
    if len(answer.answer) > 64:
        return answer.model_copy(update={"answer": answer.answer[: len(answer.answer) // 2] + " [cut]"})
    return None


def _shrink(reply: Reply) -> Reply | None:
    return _shrink_context(reply) if isinstance(reply, MemoryContext) else _shrink_answer(reply)


def fit_reply(reply: Reply, key: bytes, limit: int = DEFAULT_MAX_REQUEST_SIZE) -> Reply:
    """The reply as one Kafka message carries it. A reply over the limit would fail its send on every
    retry, so it is shrunk (its least relevant parts first) until it fits, with a warning of how much went."""
    def size(candidate: Reply) -> int:
        return record_size(key, candidate.to_bytes())

    fitted = reply
    while size(fitted) > limit and (smaller := _shrink(fitted)) is not None:
        fitted = smaller
    if fitted is not reply:
        log.warning("reply to %s was %d bytes, over the %d-byte message limit: cut to %d bytes",
                    reply.question_id, size(reply), limit, size(fitted))
    return fitted


class AnswerLoop:
    """The consumer, one transactional producer per owned partition, the topics directory, and the
    claim check built once for the worker."""

    def __init__(self, deps: AnswerDeps, consumer: AIOKafkaConsumer, stop: asyncio.Event, claims: ClaimCheck) -> None:
        self.deps = deps
        self.claims = claims
        self.consumer = consumer
        self.stop = stop
        self.group = deps.settings.answer_group
        self.producers = PartitionProducers(deps.settings, self.group)
        self.topics = TopicDirectory(consumer.topics)
        self.failures: dict[TopicPartition, int] = {}  # consecutive failed publications per partition

    async def run(self) -> None:
        try:
            while not self.stop.is_set():
                batches = await self.consumer.getmany(timeout_ms=500, max_records=8)
                await self.producers.keep_only(self.consumer.assignment())
                for tp, records in batches.items():
                    await self.answer_partition(TopicPartition(tp.topic, tp.partition), records)
        finally:
            await self.producers.close()

    def owns(self, tp: TopicPartition) -> bool:
        return not self.stop.is_set() and tp in self.consumer.assignment()

    async def answer_partition(self, tp: TopicPartition, records: list[ConsumerRecord]) -> None:
        try:
            producer, fresh = await self.producers.for_partition(tp)
            if fresh and not await self._at_committed(tp, records[0].offset):
                return
        except Exception as exc:  # the broker is unreachable: nothing was read for good, try again
            await self._retry_later(tp, records[0], exc)
            return
        for record in records:
            # One record, one process span (the child of the question's send, messaging conventions),
            # its transaction included.
            with tracing.span(f"process {record.topic}", kind="consumer", parent=tracing.extract(record.headers),
                              attributes=tracing.messaging("process", "process", record.topic,
                                                           partition=record.partition, offset=record.offset,
                                                           group=self.group)):
                if not await self._answer(tp, producer, record):
                    return

    async def _answer(self, tp: TopicPartition, producer: AIOKafkaProducer, record: ConsumerRecord) -> bool:
        """Answer and publish one record; False when the partition's batch must stop here."""
        outcome = await outcome_of(record, self.deps, self.topics, claims=self.claims,
                                   give_up=lambda: not self.owns(tp))
        if outcome is None:
            return False
        try:
            await publish_transaction(producer, outcome.messages, consumed=tp, next_offset=record.offset + 1,
                                      group=self.group)
        except Exception as exc:
            await self._retry_later(tp, record, exc)
            return False
        self.failures.pop(tp, None)
        if outcome.answer is not None:
            log.info("answered %s (%s, %.0f ms)", outcome.answer.question_id, mode_of(outcome.answer),
                     outcome.answer.latency_ms)
        return True

    async def _at_committed(self, tp: TopicPartition, first_offset: int) -> bool:
        """After a new producer settled the previous owner's transaction: continue if the batch starts
        at the committed offset, else seek there (the previous owner got further, or never as far)."""
        committed = await self.consumer.committed(tp)
        if committed is None or committed == first_offset:
            return True
        log.info("%s: resuming at the committed offset %d, not %d", tp, committed, first_offset)
        self._seek(tp, committed)
        return False

    async def _retry_later(self, tp: TopicPartition, record: ConsumerRecord, exc: Exception) -> None:
        """The transaction was aborted (fenced by a new owner, a broker hiccup, a topic gone) or the
        producer could not start: drop it, read the record again after a growing pause (a stop request
        ends it). A new producer fences any other owner and resumes from the committed offset."""
        log.warning("publishing %s[%d]@%d failed (%s: %s); it will be read again", tp.topic, tp.partition,
                    record.offset, type(exc).__name__, exc)
        await self.producers.drop(tp)
        self.topics.invalidate()
        self._seek(tp, record.offset)
        self.failures[tp] = self.failures.get(tp, 0) + 1
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=BLOCKING.delay(self.failures[tp]))
        except TimeoutError:
            pass

    def _seek(self, tp: TopicPartition, offset: int) -> None:
        if self.owns(tp):
            self.consumer.seek(tp, offset)


async def run(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    shared = await Resources.open(settings)
    metrics = shared.metrics
    assistants = AssistantPool(shared.assistants(), concurrency=settings.assistant_concurrency,
                               max_tokens=settings.assistant_max_tokens)
    turns_log = LogEnds(settings, settings.topic_turns)
    await turns_log.start()
    deps = AnswerDeps(settings=settings, pool=shared.pool, embedder=shared.embedder, master=shared.model("master"),
                      metrics=metrics, assistants=assistants, recipes=from_settings(settings), turns_log=turns_log)
    claims = ClaimCheck.from_settings(settings)  # once per worker, not per question (as ingest does)
    consumer = create_consumer(
        settings,
        settings.topic_questions,
        group_id=settings.answer_group,
        client_id=worker_client_id("answer"),
        enable_auto_commit=False,  # offsets are committed inside each question's transaction
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        # Answering can take a while on a CPU model: do not get kicked from the group.
        max_poll_interval_ms=600_000,
        session_timeout_ms=int(settings.kafka_session_timeout_s * 1000),
        heartbeat_interval_ms=int(settings.kafka_heartbeat_interval_s * 1000),
    )
    await consumer.start()
    metrics.serve(settings.answer_metrics_port, host=settings.metrics_host)
    log.info("answer consumer ready; metrics on :%d", settings.answer_metrics_port)
    lag_task = asyncio.create_task(_report_lag(settings, metrics, stop))
    try:
        await AnswerLoop(deps, consumer, stop, claims).run()
    finally:
        lag_task.cancel()
        await consumer.stop()
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

    asyncio.run(main())
