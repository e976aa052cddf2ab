"""The Faust app of the enrich worker (`epistream worker enrich`): its own process and consumer
group, so ingest never waits on the model and a slow model call never stalls ingest's group.

It consumes memory.segments and enriches each segment (epistream.pipeline.enrich); a timer enriches the
segments that wait for the model from the store once the breaker lets calls through again."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import faust
from mode import Service

from epistream.contracts.decoding import decode
from epistream.contracts.segments import Segment
from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.core.retry import Backoff
from epistream.errors import ContractError
from epistream.messaging.dead_letters import dead_letter
from epistream.messaging.kafka_io import faust_broker_options, faust_datadir, report_lag, worker_client_id
from epistream.ops.resources import Resources
from epistream.settings.processes import Settings

from . import erasure, housekeeping
from .breaker import CircuitBreaker
from .enrich import STAGE, EnrichDeps, EnrichOutcome, enrich_segment, retry_waiting
from .event_relay import EventRelay
from .records import RawRecord
from .redelivery import StallGuard, seek_back_if_stalled

log = logging.getLogger(__name__)


def worst_case_call_s(settings: Settings) -> float:
    """The longest one enrichment can hold its event: every attempt timing out after waiting out a
    refused connection, plus the waits between attempts (doubling from 0.5 s, times up to 1.5)."""
    attempts = settings.llm_max_retries + 1
    between = sum(0.5 * 2 ** n * 1.5 for n in range(attempts))
    return attempts * (settings.extractor_timeout_s + settings.llm_restart_wait_s) + between


class EnrichResources(Service):
    """The process's pool, embedder, extractor model and breaker, opened before the agent runs."""

    def __init__(self, settings: Settings, metrics: Metrics, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop=loop)
        self.settings = settings
        self.metrics = metrics
        self.shared: Resources | None = None
        self.deps: EnrichDeps | None = None

    async def on_start(self) -> None:
        self.shared = await Resources.open(self.settings, self.metrics)
        # Before a segment is enriched: a rebuilt database first learns what was forgotten.
        await erasure.catch_up(self.settings, self.shared.pool)
        breaker = CircuitBreaker(Backoff(first_s=self.settings.enrich_retry_every_s,
                                         cap_s=self.settings.enrich_pause_max_s))
        self.deps = EnrichDeps(self.settings, self.shared.pool, self.shared.embedder,
                               self.shared.model("extractor"), self.metrics, breaker)
        self.metrics.serve(self.settings.enrich_metrics_port, host=self.settings.metrics_host)
        log.info("enrich resources ready; metrics on :%d", self.settings.enrich_metrics_port)

    async def on_stop(self) -> None:
        if self.shared is not None:
            await self.shared.close()


def create_app(settings: Settings, metrics: Metrics) -> faust.App:
    app = faust.App(
        settings.enrich_group,
        **faust_broker_options(settings),
        broker_client_id=worker_client_id("enrich"),  # how health checks find this process in the group
        store="memory://",
        datadir=faust_datadir(settings, settings.enrich_group),
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        topic_allow_declare=False,
        topic_disable_leader=True,
        broker_session_timeout=settings.kafka_session_timeout_s,
        broker_heartbeat_interval=settings.kafka_heartbeat_interval_s,
        # An event is held for a whole model call chain: past it the group would give the partition
        # to another worker, which would enrich the same segment again.
        broker_max_poll_interval=worst_case_call_s(settings) + 120.0,
    )
    resources = EnrichResources(settings, metrics, loop=app.loop)
    app.add_dependency(resources)
    segments_topic = app.topic(settings.topic_segments, key_serializer="raw", value_serializer="raw")
    dlq_topic = app.topic(settings.topic_dlq, key_serializer="raw", value_serializer="raw")

    async def send_dead(key: bytes | None, value: bytes) -> None:
        await dlq_topic.send(key=key, value=value)

    async def letter(record: RawRecord, outcome: EnrichOutcome) -> None:
        assert outcome.error is not None
        await dead_letter(send_dead, metrics, record, stage=STAGE, error=outcome.error,
                          attempts=settings.llm_max_retries + 1)

    relay = EventRelay(settings, lambda: resources.shared.pool if resources.shared else None, metrics)
    guard = StallGuard()

    @app.task
    async def relay_events() -> None:
        await relay.run()

    @app.agent(segments_topic, name="enrich", concurrency=settings.enrich_concurrency)
    async def enrich(stream: faust.StreamT[bytes]) -> None:
        # Acknowledged by hand, only once the segment is enriched, waiting in the store or
        # dead-lettered: a worker stopped while a database step is retried leaves it unacknowledged.
        # An agent is given a faust.Stream: faust's StreamT, its declared type, lacks noack.
        manual = cast("faust.Stream[bytes]", stream).noack()
        async for event in manual.events():
            record = RawRecord.from_faust(event)
            # One record, one process span: the child of the segment's send, in the trace of its turn.
            with guard.handling(), tracing.span(
                    f"process {record.topic}", kind="consumer", parent=tracing.extract(record.headers),
                    attributes=tracing.messaging("process", "process", record.topic, partition=record.partition,
                                                 offset=record.offset, group=settings.enrich_group)):
                await process(record)
                await manual.ack(event)
            relay.wake()  # what the enrichment stored is committed, its events with it

    async def process(record: RawRecord) -> None:
        try:
            segment = decode(record.value, Segment, what="memory.segments event")
        except ContractError as exc:
            await dead_letter(send_dead, metrics, record, stage=STAGE, error=exc)
        else:
            assert resources.deps is not None
            outcome = await enrich_segment(segment, resources.deps)
            if outcome.error is not None:
                await letter(record, outcome)

    @app.timer(interval=settings.enrich_retry_every_s)
    async def resume_waiting() -> None:
        if resources.deps is None:
            return

        async def dead(segment: Segment, outcome: EnrichOutcome) -> None:
            # No Kafka position: the segment came from the store. Its letter carries it whole.
            await letter(RawRecord(settings.topic_segments, -1, -1, segment.conversation_id.encode(),
                                   segment.to_bytes()), outcome)

        try:
            await retry_waiting(resources.deps, on_failed=dead)
        except Exception:  # the next tick retries; a timer that raises would stop the worker
            log.exception("retrying waiting segments failed")
        relay.wake()

    @app.timer(interval=settings.segment_check_every_s)
    async def watch_lag() -> None:
        # Its own timer: a resume_waiting tick can spend minutes on the model.
        lag = await report_lag(settings, metrics, settings.enrich_group, [settings.topic_segments])
        await housekeeping.guarded("redelivery", lambda: seek_back_if_stalled(app, guard, lag, metrics), metrics)


    return app



def run_worker(settings: Settings) -> None:
    """Run the enrich worker until SIGTERM (blocks)."""
    tracing.setup("epistream-enrich", texts=settings.trace_texts)
    metrics = Metrics.create()
    app = create_app(settings, metrics)
    worker = faust.Worker(app, loglevel="INFO", quiet=True)
    worker.execute_from_commandline()
