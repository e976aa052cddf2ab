"""What the indexer (pipeline/app.py) and the enrich worker (pipeline/enrich_app.py) share as Faust
workers: the app's options, the process's resources with their metrics endpoint, the memory-event
relay, the stall guard fed by the group's lag (pipeline/redelivery.py), and running the worker.
Each app module declares only what is its own: its topics, agents and timers."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import faust
from mode import Service
from psycopg_pool import AsyncConnectionPool

from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.messaging import faust_fixes
from epistream.messaging.kafka_io import (
    PartitionLag,
    faust_broker_options,
    faust_datadir,
    records_between,
    report_lag,
    worker_client_id,
)
from epistream.ops.resources import Resources
from epistream.settings.processes import Settings

from . import erasure, housekeeping
from .event_relay import EventRelay
from .redelivery import StallGuard, seek_back_if_stalled

log = logging.getLogger(__name__)
faust_fixes.apply()  # before any consumer commits: Faust's commit never passes a record it dropped


class WorkerResources(Service):
    """The process's shared clients (:class:`epistream.ops.resources.Resources`: pool, embedder) and the
    metrics endpoint, opened before the agents run (a Faust dependency). A worker names itself and its
    metrics port, and builds what only it needs in :meth:`opened`."""

    #: How the worker calls itself in the log line that says it is ready.
    worker_name: ClassVar[str] = "worker"

    def __init__(self, settings: Settings, metrics: Metrics, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop=loop)
        self.settings = settings
        self.metrics = metrics
        self.shared: Resources | None = None

    def metrics_port(self) -> int:
        raise NotImplementedError

    async def opened(self, shared: Resources) -> None:
        """What the worker builds on the shared clients, before its metrics are served (nothing here)."""

    async def on_start(self) -> None:
        # The pipeline reads what it just wrote (segmenter state, entities to merge): the primary only.
        self.shared = await Resources.open(self.settings, self.metrics, standby_reads=False)
        # Before the agents read a record: what was forgotten stays so in a database rebuilt from Kafka.
        await erasure.catch_up(self.settings, self.shared.pool)
        await self.opened(self.shared)
        port = self.metrics_port()
        self.metrics.serve(port, host=self.settings.metrics_host)
        log.info("%s resources ready; metrics on :%d", self.worker_name, port)

    async def on_stop(self) -> None:
        if self.shared is not None:
            await self.shared.close()

    @property
    def pool(self) -> AsyncConnectionPool:
        assert self.shared is not None, "resources not started"
        return self.shared.pool

    def pool_if_open(self) -> AsyncConnectionPool | None:
        """The pool once the resources are open, None before (a task or timer may run first)."""
        return self.shared.pool if self.shared is not None else None


R = TypeVar("R", bound=WorkerResources)


def faust_app(settings: Settings, *, group: str, client: str, **options: Any) -> faust.App:
    """A worker's Faust app: consumer group `group`, Kafka client id named after `client`, and the options
    every worker runs with; `options` adds the worker's own."""
    return faust.App(
        group,
        **faust_broker_options(settings),
        broker_client_id=worker_client_id(client),  # how health checks find this process in the group
        store="memory://",
        datadir=faust_datadir(settings, group),
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        topic_allow_declare=False,  # topics are created up front with their partition counts
        topic_disable_leader=True,  # no leader-only timers: housekeeping is idempotent on every worker
        broker_session_timeout=settings.kafka_session_timeout_s,
        broker_heartbeat_interval=settings.kafka_heartbeat_interval_s,
        **options,
    )


@dataclass(frozen=True)
class WorkerApp(Generic[R]):
    """A worker's Faust app with what runs beside its own agents: its resources (a dependency), the
    memory-event relay (a task), and the stall guard its agents report their records in flight to."""

    app: faust.App
    settings: Settings
    metrics: Metrics
    resources: R
    relay: EventRelay
    #: Records the consumer fetched and dropped are fetched again (redelivery.py).
    stall_guard: StallGuard
    #: The worker's consumer group (the app's id), and the topics it consumes: whose lag the guard watches.
    group: str
    consumed: tuple[str, ...]

    @classmethod
    def build(cls, settings: Settings, metrics: Metrics, resources: type[R], *, group: str, client: str,
              consumed: tuple[str, ...], **options: Any) -> WorkerApp[R]:
        """The app (faust_app's arguments), `resources` opened as its dependency, and the relay running."""
        app = faust_app(settings, group=group, client=client, **options)
        opened: R = resources(settings, metrics, loop=app.loop)
        app.add_dependency(opened)
        relay = EventRelay(settings, opened.pool_if_open, metrics)

        @app.task
        async def relay_events() -> None:
            await relay.run()

        return cls(app, settings, metrics, opened, relay, StallGuard(), group, consumed)

    def raw_topic(self, name: str) -> faust.TopicT:
        """A topic of bytes in and out: each stage decodes (and dead-letters) what it reads itself."""
        return self.app.topic(name, key_serializer="raw", value_serializer="raw")

    async def watch_lag(self) -> None:
        """Report the group's lag, and act on what it says of stalled partitions."""
        reading = LagReading(self)
        await reading.read()
        await self.redeliver_if_stalled(reading.lag)

    async def redeliver_if_stalled(self, lag: PartitionLag | None) -> None:
        """Seek back (or restart) what the stall guard finds stalled in `lag`; a failure is counted, never raised."""
        await housekeeping.guarded("redelivery", lambda: seek_back_if_stalled(
            self.app, self.stall_guard, lag, self.metrics,
            functools.partial(records_between, self.settings)),
            self.metrics)


async def send_delivered(topic: faust.TopicT, key: bytes | None, value: bytes) -> None:
    """Send one record and wait until the broker has it: whoever acknowledges a record after its dead
    letter (checkpoint.py's rule) does so only once the letter is delivered, not merely queued."""
    delivery = await topic.send(key=key, value=value)
    await delivery


class LagReading:
    """The group's lag as one timer tick reads it: None until read, or when the broker could not say
    (the stall guard then waits for the next tick)."""

    def __init__(self, worker: WorkerApp[Any]) -> None:
        self._worker = worker
        self.lag: PartitionLag | None = None

    async def read(self) -> PartitionLag | None:
        """Set the lag gauges and keep the lag by partition (best-effort: never raises for the broker)."""
        worker = self._worker
        self.lag = await report_lag(worker.settings, worker.metrics, worker.group, list(worker.consumed))
        return self.lag

    async def log_ends(self) -> dict[int, int] | None:
        """The consumed partitions' end offsets by partition number, read with the lag."""
        lag = await self.read()
        return None if lag is None else {partition: end for (_, partition), (_, end) in lag.items()}


def run_worker(settings: Settings, *, service: str, create_app: Callable[[Settings, Metrics], faust.App]) -> None:
    """Run the app `create_app` builds until SIGTERM (blocks); its traces are named `service`."""
    tracing.setup(service, texts=settings.trace_texts)
    metrics = Metrics.create()
    app = create_app(settings, metrics)
    worker = faust.Worker(app, loglevel="INFO", quiet=True)
    try:
        worker.execute_from_commandline()
    finally:
        tracing.shutdown()
