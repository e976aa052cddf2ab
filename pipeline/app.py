"""The Faust app of the indexer: topics, the ingest agent, the erasures agent, and the housekeeping
timer (idle segments, the segment outbox, re-embedding, watermarks, stalled partitions). What it
shares with the enrich worker is pipeline/bootstrap.py's. Enrichment runs in its own worker
(epistream.pipeline.enrich_app), so ingest never waits on the model."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, TypeAlias, cast

import faust

from epistream.core import tracing
from epistream.core.claims import ClaimCheck
from epistream.core.metrics import Metrics
from epistream.messaging.erasure import parse_forgotten
from epistream.messaging.kafka_io import create_librdkafka_admin, topic_id
from epistream.models.embeddings import Embedder
from epistream.settings.processes import Settings
from epistream.storage.watermarks import forget_beyond_the_log, forget_other_incarnation

from . import bootstrap, erasure, housekeeping, outbox
from .bootstrap import LagReading, WorkerApp, WorkerResources, send_delivered
from .checkpoint import Acknowledge, Checkpoint
from .gaps import GapWatch, heal_gaps
from .ingest import IngestResult, ingest_batch
from .records import RawRecord
from .reembed import reembed_round
from .segmenter import SegmenterConfig
from .store import segments

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

#: A turn as the ingest agent takes it: the Faust event, acknowledged by hand.
TurnEvent: TypeAlias = "faust.EventT[bytes]"


class IndexerResources(WorkerResources):
    """The indexer's pool and embedder, and its metrics on the ingest port."""

    worker_name = "indexer"

    def metrics_port(self) -> int:
        return self.settings.ingest_metrics_port

    @property
    def embedder(self) -> Embedder | None:
        """None until started (the housekeeping timer may tick before)."""
        return self.shared.embedder if self.shared is not None else None


@dataclass(frozen=True)
class IndexerSends:
    """What the indexer sends to Kafka, each send awaited until the broker has it: whoever acks a record
    or marks a segment published does so only after."""

    settings: Settings
    claims: ClaimCheck
    turns: faust.TopicT
    segments: faust.TopicT
    dead_letters: faust.TopicT

    async def dead_letter(self, key: bytes | None, value: bytes) -> None:
        await send_delivered(self.dead_letters, key, value)

    async def segment(self, key: bytes, value: bytes) -> None:
        # Faust's send returns the delivery future: the outbox marks a segment published only after it.
        topic = self.settings.topic_segments
        with tracing.span(f"send {topic}", kind="producer", attributes=tracing.messaging("send", "send", topic)):
            delivery = await self.segments.send(key=key, value=value, headers=tracing.inject() or None)
            await delivery

    async def close_request(self, key: bytes, value: bytes, tenant: str) -> None:
        # Signed like any record on memory.turns: the workers hold the secret tenant keys derive from. Traced
        # as a send of its own: the segment it closes is enriched in the trace this starts.
        topic = self.settings.topic_turns
        with tracing.span(f"send {topic}", kind="producer", attributes=tracing.messaging("send", "send", topic)):
            delivery = await self.turns.send(key=key, value=value,
                                             headers=tracing.inject(self.claims.headers_for(tenant, value)))
            await delivery


@dataclass(frozen=True)
class Indexer:
    """The indexer's own work on the worker's resources: storing batches, publishing the segments they
    close, and the housekeeping tick."""

    worker: WorkerApp[IndexerResources]
    sends: IndexerSends
    segmenter: SegmenterConfig
    claims: ClaimCheck
    gaps: GapWatch

    def checkpoint(self, ack: Acknowledge[TurnEvent]) -> Checkpoint[TurnEvent]:
        """Write, then acknowledge with the agent's stream's `ack`."""
        return Checkpoint(to_record=RawRecord.from_faust, store=self.store, send_dead=self.sends.dead_letter,
                          publish=self.publish, ack=ack, metrics=self.worker.metrics,
                          max_request_size=self.worker.app.conf.producer_max_request_size)

    async def store(self, records: Sequence[RawRecord]) -> IngestResult:
        resources = self.worker.resources
        assert resources.embedder is not None
        return await ingest_batch(records, pool=resources.pool, embedder=resources.embedder,
                                  metrics=self.worker.metrics, segmenter=self.segmenter,
                                  chunk_turns=self.worker.settings.ingest_chunk, claims=self.claims)

    async def publish(self, closed: Sequence[tuple[str, str]]) -> None:
        """Send closed segments (whole) to memory.segments; each is marked published once delivered."""
        await outbox.publish(self.worker.resources.pool, closed, self.sends.segment)

    async def housekeeping_tick(self) -> None:
        """Close idle conversations and re-publish the outbox, re-embed, forget watermarks beyond the log,
        and seek back stalled partitions. A failed step (PostgreSQL restarting, the broker away) is logged
        and counted, never raised: an exception in a Faust timer stops the worker."""
        resources = self.worker.resources
        embedder = resources.embedder
        if embedder is None:
            return
        settings, metrics = self.worker.settings, self.worker.metrics
        await housekeeping.guarded("housekeeping", self.close_idle_and_republish, metrics)
        await housekeeping.guarded("reembed", lambda: reembed_round(
            resources.pool, embedder, limit=settings.reembed_batch, budget_s=settings.reembed_budget_s,
            metrics=metrics), metrics)
        # The lag is read once, for the watermarks' log ends; the stall guard then acts on the same reading.
        reading = LagReading(self.worker)
        # Marks of a deleted and re-created topic would call unstored turns stored (epistream/storage/watermarks.py):
        # those of another topic id, and those beyond the log's end (before the id is known).
        await housekeeping.guarded("watermarks", self.forget_other_incarnation, metrics)
        await housekeeping.guarded("watermarks", lambda: forget_beyond_the_log(resources.pool, settings.topic_turns,
                                                                               reading.log_ends), metrics)
        await self.worker.redeliver_if_stalled(reading.lag)
        await housekeeping.guarded("watermark_gaps", lambda: heal_gaps(self.worker.app, settings, resources.pool,
                                                                       self.gaps, metrics), metrics)

    @cached_property
    def admin(self) -> AdminClient:
        """One librdkafka admin client for the process's life, made at the first tick that needs it."""
        return create_librdkafka_admin(self.worker.settings)

    async def forget_other_incarnation(self) -> None:
        topic = self.worker.settings.topic_turns
        forgotten = await forget_other_incarnation(self.worker.resources.pool, topic, await topic_id(self.admin, topic))
        if forgotten:
            log.warning("%s was deleted and created again: the read-your-own-writes marks of partitions %s start "
                        "again from nothing", topic, forgotten)

    async def close_idle_and_republish(self) -> None:
        await housekeeping.tick(self.worker.resources.pool, idle_s=self.worker.settings.segment_idle_s,
                                send_close=self.sends.close_request, publish=self.publish)


def create_app(settings: Settings, metrics: Metrics) -> faust.App:
    worker = WorkerApp.build(settings, metrics, IndexerResources, group=settings.indexer_group, client="ingest",
                             consumed=(settings.topic_turns,))
    app, resources, relay = worker.app, worker.resources, worker.relay
    turns_topic = worker.raw_topic(settings.topic_turns)
    forgotten_topic = worker.raw_topic(settings.topic_forgotten)
    claims = ClaimCheck.from_settings(settings)
    sends = IndexerSends(settings, claims, turns=turns_topic, segments=worker.raw_topic(settings.topic_segments),
                         dead_letters=worker.raw_topic(settings.topic_dlq))
    indexer = Indexer(worker, sends, segments.config_from(settings), claims, GapWatch(settings.watermark_gap_grace_s))

    @app.agent(turns_topic, name="ingest")
    async def ingest(stream: faust.StreamT[bytes]) -> None:
        # Raw bytes in: decoding happens in ingest_batch so poison messages are dead-lettered with their
        # reason. noack_take, not take_events: take_events acks a batch in its `finally`, even when
        # the body raised or was cancelled; here each event is acked only once stored or dead-lettered.
        # Past faust's types: an agent is given a faust.Stream (StreamT lacks noack_take), and noack_take
        # yields the events themselves, though typed as the stream's values.
        events_of = cast("faust.Stream[TurnEvent]", stream)
        checkpoint = indexer.checkpoint(stream.ack)
        async for events in events_of.noack_take(settings.ingest_batch, within=settings.ingest_batch_within_s):
            with worker.stall_guard.handling((e.message.topic, e.message.partition) for e in events):
                await checkpoint.store_then_ack(events)
            relay.wake()  # the batch's memory events are committed: out with them

    @app.agent(forgotten_topic, name="forgotten")
    async def forgotten(stream: faust.StreamT[bytes]) -> None:
        # Erasures written after this worker started (by a `forget` on this database they are already
        # applied, and skipped; by one on another database, such as a rebuild's source, they are not).
        async for value in stream:
            record = parse_forgotten(value)
            if record is not None:
                await erasure.apply_arriving(resources.pool, record, metrics)
                relay.wake()

    @app.timer(interval=settings.segment_check_every_s)
    async def housekeeping_timer() -> None:
        await indexer.housekeeping_tick()

    return app


def run_worker(settings: Settings) -> None:
    """Run the indexer until SIGTERM (blocks)."""
    bootstrap.run_worker(settings, service="epistream-ingest", create_app=create_app)
