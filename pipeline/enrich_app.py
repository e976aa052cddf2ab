"""The Faust app of the enrich worker (`epistream worker enrich`): its own process and consumer
group, so ingest never waits on the model and a slow model call never stalls ingest's group.

It consumes memory.segments and enriches each segment (epistream.pipeline.enrich); a timer enriches the
segments that wait for the model from the store once the breaker lets calls through again. What it
shares with the indexer is pipeline/bootstrap.py's."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import cast

import faust

from epistream.contracts.decoding import decode
from epistream.contracts.segments import Segment
from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.core.retry import Backoff
from epistream.errors import ContractError
from epistream.messaging.dead_letters import dead_letter
from epistream.ops.resources import Resources
from epistream.settings.processes import Settings

from . import bootstrap
from .bootstrap import WorkerApp, WorkerResources, send_delivered
from .breaker import CircuitBreaker
from .enrich import STAGE, EnrichDeps, EnrichOutcome, enrich_segment, retry_waiting
from .records import RawRecord

log = logging.getLogger(__name__)


def worst_case_call_s(settings: Settings) -> float:
    """The longest one enrichment can hold its event: every attempt timing out after waiting out a
    refused connection, plus the waits between attempts (doubling from 0.5 s, times up to 1.5)."""
    attempts = settings.llm_max_retries + 1
    between = sum(0.5 * 2 ** n * 1.5 for n in range(attempts))
    return attempts * (settings.extractor_timeout_s + settings.llm_restart_wait_s) + between


class EnrichResources(WorkerResources):
    """The process's pool, embedder, extractor model and breaker, opened before the agent runs."""

    worker_name = "enrich"
    #: What enriching a segment needs; None until the resources are open (a timer may tick before).
    deps: EnrichDeps | None = None

    def metrics_port(self) -> int:
        return self.settings.enrich_metrics_port

    async def opened(self, shared: Resources) -> None:
        breaker = CircuitBreaker(Backoff(first_s=self.settings.enrich_retry_every_s,
                                         cap_s=self.settings.enrich_pause_max_s))
        self.deps = EnrichDeps(self.settings, shared.pool, shared.embedder, shared.model("extractor"),
                               self.metrics, breaker)


@dataclass(frozen=True)
class Enricher:
    """The enrich worker's own handling of a segment: enriched, left waiting in the store, or
    dead-lettered with its reason."""

    settings: Settings
    metrics: Metrics
    resources: EnrichResources
    dead_letters: faust.TopicT

    async def send_dead(self, key: bytes | None, value: bytes) -> None:
        # Delivered before the segment is acknowledged (it was only queued before: a crash lost the letter).
        await send_delivered(self.dead_letters, key, value)

    def process_span(self, record: RawRecord) -> AbstractContextManager[object]:
        """One record, one process span: the child of the segment's send, in the trace of its turn."""
        return tracing.span(f"process {record.topic}", kind="consumer", parent=tracing.extract(record.headers),
                            attributes=tracing.messaging("process", "process", record.topic,
                                                         partition=record.partition, offset=record.offset,
                                                         group=self.settings.enrich_group))

    async def process(self, record: RawRecord) -> None:
        try:
            segment = decode(record.value, Segment, what="memory.segments event")
        except ContractError as exc:
            await dead_letter(self.send_dead, self.metrics, record, stage=STAGE, error=exc)
        else:
            assert self.resources.deps is not None
            outcome = await enrich_segment(segment, self.resources.deps)
            if outcome.error is not None:
                await self.letter(record, outcome)

    async def letter(self, record: RawRecord, outcome: EnrichOutcome) -> None:
        assert outcome.error is not None
        await dead_letter(self.send_dead, self.metrics, record, stage=STAGE, error=outcome.error,
                          attempts=self.settings.llm_max_retries + 1)

    async def letter_from_store(self, segment: Segment, outcome: EnrichOutcome) -> None:
        # No Kafka position: the segment came from the store. Its letter carries it whole.
        await self.letter(RawRecord(self.settings.topic_segments, -1, -1, segment.conversation_id.encode(),
                                    segment.to_bytes()), outcome)

    async def resume_waiting(self) -> bool:
        """Enrich what waits for the model, once the breaker lets calls through; a failure is logged and
        the next tick retries (a timer that raises would stop the worker). False when nothing was tried:
        the resources are not open yet."""
        if self.resources.deps is None:
            return False
        try:
            await retry_waiting(self.resources.deps, on_failed=self.letter_from_store)
        except Exception:
            log.exception("retrying waiting segments failed")
        return True


def create_app(settings: Settings, metrics: Metrics) -> faust.App:
    worker = WorkerApp.build(
        settings, metrics, EnrichResources, group=settings.enrich_group, client="enrich",
        consumed=(settings.topic_segments,),
        # An event is held for a whole model call chain: past it the group would give the partition
        # to another worker, which would enrich the same segment again.
        broker_max_poll_interval=worst_case_call_s(settings) + 120.0,
    )
    app, relay = worker.app, worker.relay
    segments_topic = worker.raw_topic(settings.topic_segments)
    enricher = Enricher(settings, metrics, worker.resources, worker.raw_topic(settings.topic_dlq))

    @app.agent(segments_topic, name="enrich", concurrency=settings.enrich_concurrency)
    async def enrich(stream: faust.StreamT[bytes]) -> None:
        # Acknowledged by hand, only once the segment is enriched, waiting in the store or
        # dead-lettered: a worker stopped while a database step is retried leaves it unacknowledged.
        # An agent is given a faust.Stream: faust's StreamT, its declared type, lacks noack.
        manual = cast("faust.Stream[bytes]", stream).noack()
        async for event in manual.events():
            record = RawRecord.from_faust(event)
            with worker.stall_guard.handling([(record.topic, record.partition)]), enricher.process_span(record):
                await enricher.process(record)
                await manual.ack(event)
            relay.wake()  # what the enrichment stored is committed, its events with it

    @app.timer(interval=settings.enrich_retry_every_s)
    async def resume_waiting() -> None:
        if await enricher.resume_waiting():
            relay.wake()  # what it enriched is committed, its events with it

    @app.timer(interval=settings.segment_check_every_s)
    async def watch_lag() -> None:
        # Its own timer: a resume_waiting tick can spend minutes on the model.
        await worker.watch_lag()

    return app


def run_worker(settings: Settings) -> None:
    """Run the enrich worker until SIGTERM (blocks)."""
    bootstrap.run_worker(settings, service="epistream-enrich", create_app=create_app)
