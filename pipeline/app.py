"""The Faust app of the indexer: topics, resources and the ingest agent."""

from __future__ import annotations

import logging

import faust
from mode import Service
from psycopg_pool import AsyncConnectionPool

from epistream.db import create_pool
from epistream.embeddings import Embedder
from epistream.metrics import Metrics
from epistream.settings import Settings

from .ingest import ingest_batch
from .records import RawRecord

log = logging.getLogger(__name__)

APP_ID = "epistream-indexer"


class IndexerResources(Service):
    """The Postgres pool, the embedder and the metrics endpoint, opened before the agents run."""

    def __init__(self, settings: Settings, metrics: Metrics, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.settings = settings
        self.metrics = metrics
        self.pool: AsyncConnectionPool = create_pool(settings)
        self.embedder: Embedder | None = None

    async def on_start(self) -> None:
        await self.pool.open(wait=True)
        self.embedder = Embedder.from_settings(self.settings)
        self.metrics.serve(self.settings.ingest_metrics_port)
        log.info("indexer resources ready; metrics on :%d", self.settings.ingest_metrics_port)

    async def on_stop(self) -> None:
        await self.pool.close()


def create_app(settings: Settings, metrics: Metrics) -> faust.App:
    app = faust.App(
        APP_ID,
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        topic_allow_declare=False,  # topics are created up front with their partition counts
        topic_disable_leader=True,
    )
    resources = IndexerResources(settings, metrics, loop=app.loop)
    app.add_dependency(resources)

    turns_topic = app.topic(settings.topic_turns, key_serializer="raw", value_serializer="raw")
    dlq_topic = app.topic(settings.topic_dlq, key_serializer="raw", value_serializer="raw")

    @app.agent(turns_topic, name="ingest")
    async def ingest(stream):  # type: ignore[no-untyped-def]
        # Raw bytes in: decoding happens in ingest_batch so poison messages are
        # dead-lettered with their reason instead of crashing the stream.
        async for events in stream.take_events(settings.ingest_batch, within=settings.ingest_batch_within_s):
            records = [_record(event) for event in events]
            assert resources.embedder is not None
            result = await ingest_batch(records, pool=resources.pool, embedder=resources.embedder, metrics=metrics)
            for letter in result.dead:
                await dlq_topic.send(key=letter.original_key(), value=letter.to_bytes())

    return app


def _record(event: faust.types.EventT) -> RawRecord:
    message = event.message
    return RawRecord(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=message.key,
        value=message.value,
        timestamp_ms=int(message.timestamp * 1000) if message.timestamp else None,
    )


def run_worker(settings: Settings) -> None:
    """Run the indexer until SIGTERM (blocks)."""
    metrics = Metrics.create()
    app = create_app(settings, metrics)
    worker = faust.Worker(app, loglevel="INFO", quiet=True)
    worker.execute_from_commandline()
