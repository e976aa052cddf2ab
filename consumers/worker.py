"""The answer consumer: `memory.questions` in, `memory.answers` (or the asked reply topic) out.

Offsets are committed only after the answer (or the dead letter) is produced,
so a crash re-answers a question rather than losing it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time

import psycopg
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from epistream.contracts import Question
from epistream.db import create_pool
from epistream.embeddings import Embedder
from epistream.errors import ContractError, EpistreamError
from epistream.kafka_io import consumer_lag, count_dead_letter, create_producer, dead_letter, worker_client_id
from epistream.metrics import Metrics
from epistream.resources import model_client
from epistream.settings import Settings

from .answer import answer_question, failed_answer
from .assistants import AssistantPool
from .deps import AnswerDeps
from .retrieval import from_settings

log = logging.getLogger(__name__)

STAGE = "answer"


async def handle_question(record: ConsumerRecord, deps: AnswerDeps, producer) -> None:  # type: ignore[no-untyped-def]
    settings = deps.settings
    try:
        try:
            question = Question.from_bytes(record.value)
        except (ValidationError, ValueError) as exc:
            raise ContractError(f"not a valid memory.questions event: {str(exc)[:500]}") from exc
    except ContractError as exc:
        await _dead_letter(record, exc, deps, producer)
        return
    started = time.perf_counter()
    try:
        answer = await answer_question(question, deps)
    except EpistreamError as exc:
        # The model kept failing: tell the asker, and keep the question for a replay.
        answer = failed_answer(question, exc, started)
        deps.metrics.questions_answered.labels(answer.mode.value, "failed").inc()
        await _dead_letter(record, exc, deps, producer)
    await producer.send_and_wait(
        question.reply_topic or settings.topic_answers, key=question.question_id.encode(), value=answer.to_bytes()
    )
    log.info("answered %s (%s, %.0f ms)", question.question_id, answer.mode.value, answer.latency_ms)


async def _handle_with_retry(record: ConsumerRecord, deps: AnswerDeps, producer, stop: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
    """A database or broker hiccup must not lose the question: retry it, offset uncommitted."""
    attempt = 0
    while True:
        try:
            await handle_question(record, deps, producer)
            return
        except (psycopg.OperationalError, KafkaError) as exc:
            attempt += 1
            delay = min(30.0, 0.5 * 2 ** min(attempt, 6)) * (0.5 + random.random() / 2)
            log.warning("question at %s[%d]@%d failed (%s), retry %d in %.1fs", record.topic, record.partition,
                        record.offset, type(exc).__name__, attempt, delay)
            if stop.is_set():
                raise
            await asyncio.sleep(delay)


async def _dead_letter(record: ConsumerRecord, exc: Exception, deps: AnswerDeps, producer) -> None:  # type: ignore[no-untyped-def]
    letter = dead_letter(
        topic=record.topic, partition=record.partition, offset=record.offset,
        key=record.key, value=record.value, stage=STAGE, error=exc,
    )
    count_dead_letter(deps.metrics, letter)
    await producer.send_and_wait(deps.settings.topic_dlq, key=record.key, value=letter.to_bytes())


async def run(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    metrics = Metrics.create()
    pool = create_pool(settings)
    await pool.open(wait=True)
    embedder = Embedder.from_settings(settings)
    master = model_client(settings, "master", metrics)
    assistants = AssistantPool(
        [model_client(settings, "assistant", metrics, base_url=url) for url in settings.assistant_urls],
        concurrency=settings.assistant_concurrency, max_tokens=settings.assistant_max_tokens,
    )
    deps = AnswerDeps(settings=settings, pool=pool, embedder=embedder, master=master, metrics=metrics,
                      assistants=assistants, recipes=from_settings(settings))
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
        await pool.close()


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
