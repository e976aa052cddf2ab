"""The answer consumer: `memory.questions` in, `memory.answers` (or the asked reply topic) out.

Offsets are committed only after the answer (or the dead letter) is produced,
so a crash re-answers a question rather than losing it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from epistream.contracts import Question, decode
from epistream.errors import ContractError, EpistreamError
from epistream.kafka_io import DeadLetterSend, consumer_lag, create_producer, dead_letter, worker_client_id
from epistream.metrics import Metrics
from epistream.resources import Resources
from epistream.retry import BLOCKING, retry
from epistream.settings import Settings

from .answer import answer_question, failed_answer
from .assistants import AssistantPool
from .deps import AnswerDeps
from .retrieval import from_settings

log = logging.getLogger(__name__)

STAGE = "answer"


async def handle_question(record: ConsumerRecord, deps: AnswerDeps, producer) -> None:  # type: ignore[no-untyped-def]
    settings = deps.settings
    send_dead = _dlq_sender(producer, settings.topic_dlq)
    try:
        question = decode(record.value, Question, what="memory.questions event")
    except ContractError as exc:
        await dead_letter(send_dead, deps.metrics, record, stage=STAGE, error=exc)
        return
    started = time.perf_counter()
    try:
        answer = await answer_question(question, deps)
    except EpistreamError as exc:
        # The model kept failing: tell the asker, and keep the question for a replay.
        answer = failed_answer(question, exc, started)
        deps.metrics.questions_answered.labels(answer.mode.value, "failed").inc()
        await dead_letter(send_dead, deps.metrics, record, stage=STAGE, error=exc)
    await producer.send_and_wait(
        question.reply_topic or settings.topic_answers, key=question.question_id.encode(), value=answer.to_bytes()
    )
    log.info("answered %s (%s, %.0f ms)", question.question_id, answer.mode.value, answer.latency_ms)


async def _handle_with_retry(record: ConsumerRecord, deps: AnswerDeps, producer, stop: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
    """A database or broker hiccup must not lose the question: retry it, offset uncommitted."""

    def waiting(exc: BaseException, attempt: int, delay: float) -> None:
        log.warning("question at %s[%d]@%d failed (%s), retry %d in %.1fs", record.topic, record.partition,
                    record.offset, type(exc).__name__, attempt, delay)

    await retry(lambda: handle_question(record, deps, producer), backoff=BLOCKING, on_retry=waiting,
                stop=stop.is_set)


def _dlq_sender(producer, topic: str) -> DeadLetterSend:  # type: ignore[no-untyped-def]
    async def send(key: bytes | None, value: bytes) -> None:
        await producer.send_and_wait(topic, key=key, value=value)
    return send


async def run(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    shared = await Resources.open(settings)
    metrics = shared.metrics
    assistants = AssistantPool(shared.assistants(), concurrency=settings.assistant_concurrency,
                               max_tokens=settings.assistant_max_tokens)
    deps = AnswerDeps(settings=settings, pool=shared.pool, embedder=shared.embedder, master=shared.model("master"),
                      metrics=metrics, assistants=assistants, recipes=from_settings(settings))
    producer = create_producer(settings)
    consumer = AIOKafkaConsumer(
        settings.topic_questions,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.answer_group,
        client_id=worker_client_id("answer"),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # Answering can take a while on a CPU model: do not get kicked from the group.
        max_poll_interval_ms=600_000,
    )
    await producer.start()
    await consumer.start()
    metrics.serve(settings.answer_metrics_port, host=settings.metrics_host)
    log.info("answer consumer ready; metrics on :%d", settings.answer_metrics_port)
    lag_task = asyncio.create_task(_report_lag(settings, metrics, stop))
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500, max_records=8)
            for tp, records in batches.items():
                for record in records:
                    await _handle_with_retry(record, deps, producer, stop)
                    await consumer.commit({TopicPartition(tp.topic, tp.partition): record.offset + 1})
    finally:
        lag_task.cancel()
        await consumer.stop()
        await producer.stop()
        await shared.close()


async def _report_lag(settings: Settings, metrics: Metrics, stop: asyncio.Event, every_s: float = 5.0) -> None:
    while not stop.is_set():
        try:
            lag = await consumer_lag(settings, settings.answer_group, [settings.topic_questions])
            for topic, value in lag.items():
                metrics.consumer_lag.labels(settings.answer_group, topic).set(value)
        except Exception as exc:  # telemetry only: never stop answering for it
            log.debug("consumer lag unavailable: %s", exc)
        await asyncio.sleep(every_s)


def run_worker(settings: Settings) -> None:
    """Run the answer consumer until SIGTERM or SIGINT (blocks)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(settings, stop=stop)

    asyncio.run(main())
