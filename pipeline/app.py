"""The Faust app of the indexer: topics, resources, the ingest agent, and the
housekeeping timer (idle segments, the segment outbox, re-embedding). Enrichment runs in its
own worker (epistream.pipeline.enrich_app), so ingest never waits on the model."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import cast

import faust
from mode import Service
from psycopg_pool import AsyncConnectionPool

from epistream.core import tracing
from epistream.core.claims import ClaimCheck
from epistream.core.metrics import Metrics
from epistream.messaging.erasure import parse_forgotten
from epistream.messaging.kafka_io import PartitionLag, faust_broker_options, faust_datadir, report_lag, worker_client_id
from epistream.models.embeddings import Embedder
from epistream.ops.resources import Resources
from epistream.settings.processes import Settings
from epistream.storage.watermarks import forget_beyond_the_log

from . import erasure, housekeeping, outbox
from .delivery import settle
from .event_relay import EventRelay
from .ingest import IngestResult, ingest_batch
from .records import RawRecord
from .redelivery import StallGuard, seek_back_if_stalled
from .reembed import reembed_round
from .store import segments

log = logging.getLogger(__name__)


class IndexerResources(Service):
    """The process's shared clients (:class:`epistream.ops.resources.Resources`: pool, embedder) and
    the metrics endpoint, opened before the agents run (a Faust dependency)."""

    def __init__(self, settings: Settings, metrics: Metrics, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop=loop)
        self.settings = settings
        self.metrics = metrics
        self.shared: Resources | None = None

    async def on_start(self) -> None:
        self.shared = await Resources.open(self.settings, self.metrics)
        # Before the agents read a turn: what was forgotten stays so in a database rebuilt from Kafka.
        await erasure.catch_up(self.settings, self.shared.pool)
        self.metrics.serve(self.settings.ingest_metrics_port, host=self.settings.metrics_host)
        log.info("indexer resources ready; metrics on :%d", self.settings.ingest_metrics_port)

    async def on_stop(self) -> None:
        if self.shared is not None:
            await self.shared.close()

    @property
    def pool(self) -> AsyncConnectionPool:
        assert self.shared is not None, "resources not started"
        return self.shared.pool

    @property
    def embedder(self) -> Embedder | None:
        """None until started (the housekeeping timer may tick before)."""
        return self.shared.embedder if self.shared is not None else None


def create_app(settings: Settings, metrics: Metrics) -> faust.App:
    app = faust.App(
        settings.indexer_group,
        **faust_broker_options(settings),
        broker_client_id=worker_client_id("ingest"),  # how health checks find this process in the group
        store="memory://",
        datadir=faust_datadir(settings, settings.indexer_group),
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        topic_allow_declare=False,  # topics are created up front with their partition counts
        topic_disable_leader=True,  # no leader-only timers: housekeeping is idempotent on every worker
        broker_session_timeout=settings.kafka_session_timeout_s,
        broker_heartbeat_interval=settings.kafka_heartbeat_interval_s,
    )
    resources = IndexerResources(settings, metrics, loop=app.loop)
    app.add_dependency(resources)
    segmenter = segments.config_from(settings)
    claims = ClaimCheck.from_settings(settings)
    guard = StallGuard()  # records the consumer fetched and dropped are fetched again (redelivery.py)

    turns_topic = app.topic(settings.topic_turns, key_serializer="raw", value_serializer="raw")
    segments_topic = app.topic(settings.topic_segments, key_serializer="raw", value_serializer="raw")
    dlq_topic = app.topic(settings.topic_dlq, key_serializer="raw", value_serializer="raw")

    async def send_dead(key: bytes | None, value: bytes) -> None:
        # Awaited to delivery: a record is acked only once its letter is in Kafka.
        delivery = await dlq_topic.send(key=key, value=value)
        await delivery

    async def send_segment(key: bytes, value: bytes) -> None:
        # Faust's send returns the delivery future: the outbox marks a segment published only after it.
        with tracing.span(f"send {settings.topic_segments}", kind="producer",
                          attributes=tracing.messaging("send", "send", settings.topic_segments)):
            delivery = await segments_topic.send(key=key, value=value, headers=tracing.inject() or None)
            await delivery

    async def publish(closed: Sequence[tuple[str, str]]) -> None:
        """Send closed segments (whole) to memory.segments; each is marked published once delivered."""
        await outbox.publish(resources.pool, closed, send_segment)

    async def ingest_records(records: Sequence[RawRecord]) -> IngestResult:
        assert resources.embedder is not None
        return await ingest_batch(records, pool=resources.pool, embedder=resources.embedder, metrics=metrics,
                                  segmenter=segmenter, chunk_turns=settings.ingest_chunk, claims=claims)

    @app.agent(turns_topic, name="ingest")
    async def ingest(stream: faust.StreamT[bytes]) -> None:
        # Raw bytes in: decoding happens in ingest_batch so poison messages are dead-lettered with their
        # reason. noack_take, not take_events: take_events acks a batch in its `finally`, even when
        # the body raised or was cancelled; here each event is acked only once stored or dead-lettered.
        # Past faust's types: an agent is given a faust.Stream (StreamT lacks noack_take), and noack_take
        # yields the events themselves, though typed as the stream's values.
        events_of = cast("faust.Stream[faust.EventT[bytes]]", stream)
        async for events in events_of.noack_take(settings.ingest_batch, within=settings.ingest_batch_within_s):
            with guard.handling(len(events)):
                await settle(events, to_record=RawRecord.from_faust, ingest=ingest_records, send_dead=send_dead,
                             publish=publish, ack=stream.ack, metrics=metrics,
                             max_request_size=app.conf.producer_max_request_size)
            relay.wake()  # the batch's memory events are committed: out with them

    relay = EventRelay(settings, lambda: resources.shared.pool if resources.shared else None, metrics)

    @app.task
    async def relay_events() -> None:
        await relay.run()

    forgotten_topic = app.topic(settings.topic_forgotten, key_serializer="raw", value_serializer="raw")

    @app.agent(forgotten_topic, name="forgotten")
    async def forgotten(stream: faust.StreamT[bytes]) -> None:
        # Erasures written after this worker started (by a `forget` on this database they are already
        # applied, and skipped; by one on another database, such as a rebuild's source, they are not).
        async for value in stream:
            record = parse_forgotten(value)
            if record is not None:
                await erasure.apply_arriving(resources.pool, record, metrics)
                relay.wake()

    async def send_close(key: bytes, value: bytes, tenant: str) -> None:
        # Signed like any record on memory.turns: the workers hold the secret tenant keys derive from. Traced
        # as a send of its own: the segment it closes is enriched in the trace this starts.
        with tracing.span(f"send {settings.topic_turns}", kind="producer",
                          attributes=tracing.messaging("send", "send", settings.topic_turns)):
            delivery = await turns_topic.send(key=key, value=value,
                                              headers=tracing.inject(claims.headers_for(tenant, value)))
            await delivery

    async def housekeeping_round() -> None:
        await housekeeping.tick(resources.pool, idle_s=settings.segment_idle_s, send_close=send_close,
                                publish=publish)

    @app.timer(interval=settings.segment_check_every_s)
    async def housekeeping_timer() -> None:
        if resources.embedder is None:
            return
        # A failed round (PostgreSQL restarting, the broker away) is logged and counted, never raised:
        # an exception in a Faust timer stops the worker.
        await housekeeping.guarded("housekeeping", housekeeping_round, metrics)
        embedder = resources.embedder
        await housekeeping.guarded("reembed", lambda: reembed_round(
            resources.pool, embedder, limit=settings.reembed_batch, budget_s=settings.reembed_budget_s,
            metrics=metrics), metrics)
        lag: PartitionLag | None = None

        async def ends() -> dict[int, int] | None:
            nonlocal lag
            lag = await report_lag(settings, metrics, settings.indexer_group, [settings.topic_turns])
            return None if lag is None else {partition: end for (_, partition), (_, end) in lag.items()}

        # Marks of a deleted and re-created topic would call unstored turns stored (epistream/storage/watermarks.py).
        await housekeeping.guarded("watermarks", lambda: forget_beyond_the_log(resources.pool, settings.topic_turns,
                                                                               ends), metrics)
        await housekeeping.guarded("redelivery", lambda: seek_back_if_stalled(app, guard, lag, metrics), metrics)


    return app



def run_worker(settings: Settings) -> None:
    """Run the indexer until SIGTERM (blocks)."""
    tracing.setup("epistream-ingest", texts=settings.trace_texts)
    metrics = Metrics.create()
    app = create_app(settings, metrics)
    worker = faust.Worker(app, loglevel="INFO", quiet=True)
    worker.execute_from_commandline()
