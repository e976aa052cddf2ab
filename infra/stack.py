"""What the supervisor runs for the embedded default: each service and worker as a
:class:`~epistream.infra.service.ServiceSpec`, in start order, built from the settings."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from functools import partial

from epistream.messaging.topics import ensure_topics
from epistream.ops.health import WORKERS
from epistream.ops.readiness import port_open
from epistream.settings.processes import Settings

from .kafka_broker import prepare_broker
from .model_server import model_listed, model_server_argv
from .postgres_server import after_postgres_ready, postgres_ready, prepare_postgres
from .service import ServiceSpec


def worker_port(settings: Settings, worker: str) -> int:
    return {"ingest": settings.ingest_metrics_port, "enrich": settings.enrich_metrics_port,
            "answer": settings.answer_metrics_port}[worker]


def service_specs(settings: Settings) -> list[ServiceSpec]:
    """Every embedded service this configuration runs (external ones are only probed)."""
    specs: list[ServiceSpec] = []
    if settings.kafka_embedded:
        broker = prepare_broker(settings)
        specs.append(ServiceSpec(
            name="kafka", argv=broker.argv, ready=lambda: port_open(broker.host, broker.port),
            after_ready=lambda: asyncio.run(ensure_topics(settings)), start_timeout_s=120.0, stop_timeout_s=60.0,
        ))
    if settings.database_url is None:
        pg = prepare_postgres(settings)
        specs.append(ServiceSpec(
            name="postgres", argv=pg.argv, user=pg.user, ready=lambda: postgres_ready(pg),
            after_ready=lambda: after_postgres_ready(settings, pg),
            stop_signal=signal.SIGINT,  # "fast" shutdown: roll back open transactions, then exit
            stop_timeout_s=60.0, start_timeout_s=120.0,
        ))
    if settings.model_server_embedded:
        specs.append(ServiceSpec(
            name="model-server", argv=model_server_argv(settings), ready=lambda: model_listed(settings),
            start_timeout_s=180.0,
        ))
    env = {**os.environ, "EPISTREAM_HOME": str(settings.state_dir)}
    needs = tuple(s.name for s in specs if s.name in ("kafka", "postgres"))
    for worker in WORKERS:
        port = worker_port(settings, worker)
        specs.append(ServiceSpec(
            name=f"worker-{worker}", argv=worker_argv(worker), env=env,
            ready=partial(port_open, "127.0.0.1", port), requires=needs, start_timeout_s=120.0,
            stop_timeout_s=30.0,
        ))
    return specs


def worker_argv(worker: str) -> list[str]:
    """How a worker is started: `-P` keeps the working directory off its import path, so a user's own
    folder named like a module (infra/, pipeline/ ...) is never imported instead of epistream's."""
    return [sys.executable, "-P", "-m", "epistream.apps.cli.main", "worker", worker]
