"""Health probes that use each service the way the workers do.

A port that accepts connections proves little: a model server can list its
models and die at its first completion, a worker can hold its port while it has
left its consumer group. So each probe does one real, cheap piece of work:

- Kafka: metadata, then a record produced to the health topic and read back.
- PostgreSQL: a query on the memory tables as the application role.
- model server: a one-token chat completion in the configured JSON mode. One that
  does not answer in time while the workers have calls in flight is ``busy``,
  not down (a llama.cpp server computes one request at a time).
- embedder: one sentence through the ONNX model.
- worker: its ``/metrics`` endpoint, and its membership in its consumer group
  (found by the client id that names its host and pid).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, cast

import openai
import psycopg
from aiokafka import TopicPartition
from pydantic import BaseModel

from epistream.core.metrics import read_samples
from epistream.messaging.kafka_io import (
    create_admin,
    create_consumer,
    create_producer,
    group_members,
    worker_client_id,
    worker_client_prefix,
)
from epistream.messaging.topics import ensure_topics
from epistream.models.llm import create_client, endpoint_name, response_format, shown_url
from epistream.settings.embedder_cards import TURN_EMBEDDING_VERSION
from epistream.settings.processes import Settings
from epistream.storage.db import database_url

if TYPE_CHECKING:
    from openai.types.chat.completion_create_params import ResponseFormat

WORKERS = ("ingest", "enrich", "answer")


class Health(StrEnum):
    UP = "up"
    #: alive and working, but it could not take the probe in time
    BUSY = "busy"
    DOWN = "down"


@dataclass(frozen=True)
class Probe:
    service: str
    state: Health
    detail: str
    seconds: float
    #: it gave no answer in time (as opposed to an error): a busy server looks like this
    timed_out: bool = False

    @property
    def healthy(self) -> bool:
        return self.state is not Health.DOWN


class _ProbeReply(BaseModel):
    ok: bool


def worker_group(settings: Settings, worker: str) -> str:
    return {"ingest": settings.indexer_group, "enrich": settings.enrich_group, "answer": settings.answer_group}[worker]


def worker_metrics_url(settings: Settings, worker: str) -> str:
    port = {"ingest": settings.ingest_metrics_port, "enrich": settings.enrich_metrics_port,
            "answer": settings.answer_metrics_port}[worker]
    host = "127.0.0.1" if settings.metrics_host in ("0.0.0.0", "") else settings.metrics_host
    return f"http://{host}:{port}/metrics"


def model_endpoints(settings: Settings) -> list[str]:
    """Every distinct model endpoint the workers call (master, extractor, assistants)."""
    urls = [settings.llm_base_url, settings.extractor_url, *settings.assistant_urls]
    return list(dict.fromkeys(u.rstrip("/") for u in urls))


async def _timed(service: str, timeout_s: float, work: Callable[[], Awaitable[tuple[Health, str]]]) -> Probe:
    started = time.perf_counter()
    timed_out = False
    try:
        state, detail = await asyncio.wait_for(work(), timeout_s)
    except TimeoutError:
        state, detail, timed_out = Health.DOWN, f"no answer within {timeout_s:.0f}s", True
    except Exception as exc:  # a probe reports every failure; it never raises
        state, detail = Health.DOWN, f"{type(exc).__name__}: {str(exc)[:300]}"
        timed_out = isinstance(exc, openai.APITimeoutError)
    return Probe(service, state, detail, time.perf_counter() - started, timed_out)


async def probe_kafka(settings: Settings) -> Probe:
    async def work() -> tuple[Health, str]:
        admin = create_admin(settings, request_timeout_ms=5_000)
        try:
            await admin.start()
            topics = set(await admin.list_topics())
        finally:
            await admin.close()
        if settings.topic_health not in topics:
            await ensure_topics(settings, timeout_s=5.0)
        token = uuid.uuid4().hex.encode()
        producer = create_producer(settings)
        consumer = create_consumer(settings, group_id=None, enable_auto_commit=False)
        try:
            await producer.start()
            await consumer.start()
            sent = await producer.send_and_wait(settings.topic_health, value=token)
            partition = TopicPartition(settings.topic_health, sent.partition)
            consumer.assign([partition])
            consumer.seek(partition, sent.offset)
            while True:
                batch = await consumer.getmany(partition, timeout_ms=1000)
                if any(r.value == token for r in batch.get(partition, [])):
                    return Health.UP, f"{len(topics)} topics; a probe record produced and read back"
        finally:  # stopping a client that never started is harmless
            await consumer.stop()
            await producer.stop()

    return await _timed("kafka", settings.health_timeout_s, work)


async def probe_postgres(settings: Settings) -> Probe:
    async def work() -> tuple[Health, str]:
        conn = await psycopg.AsyncConnection.connect(database_url(settings), connect_timeout=5, autocommit=True)
        try:
            # As the workers' login with no tenant named, row-level security shows no row:
            # the query proves the login, the schema and the policies, not the data.
            cur = await conn.execute("SELECT current_user, count(*) FROM memory.turns")
            row = await cur.fetchone()
            # Across tenants, counts only: how far a switch of embedding model has come (sql/018).
            cur = await conn.execute("SELECT coalesce(sum(rows), 0) FROM memory.vectors_to_reembed(%s, %s)",
                                     (settings.embedding_model, TURN_EMBEDDING_VERSION))
            stale = await cur.fetchone()
        finally:
            await conn.close()
        assert row is not None and stale is not None
        pending = f"; {stale[0]:,} stored vectors still to re-embed with {settings.embedding_model}" if stale[0] else ""
        return Health.UP, f"queried memory.turns as {row[0]}{pending}"

    return await _timed("postgres", settings.health_timeout_s, work)


async def _calls_in_flight(settings: Settings, endpoint: str) -> int:
    """Model calls to `endpoint` the workers are waiting on, from their metrics (0 where unreadable)."""
    total = 0.0
    for worker in WORKERS:
        try:
            samples = await asyncio.to_thread(read_samples, worker_metrics_url(settings, worker), 2.0)
        except OSError:
            continue
        total += sum(s.value for s in samples
                     if s.name == "epistream_model_requests_in_flight" and s.labels.get("endpoint") == endpoint)
    return int(total)


async def probe_model(settings: Settings, base_url: str, *, service: str = "model-server") -> Probe:
    timeout_s = settings.health_timeout_s
    client = create_client(settings, base_url=base_url, timeout_s=timeout_s)

    async def work() -> tuple[Health, str]:
        response = await client.chat.completions.create(
            model=settings.llm_model,
            messages=[{"role": "user", "content": 'Reply with the JSON object {"ok": true}.'}],
            max_tokens=1, temperature=0.0,
            # llama.cpp's json_object format carries a schema, which openai's ResponseFormat does not allow.
            response_format=cast("ResponseFormat", response_format(_ProbeReply, settings.llm_json_mode)),
        )
        if not response.choices:
            return Health.DOWN, "completion returned no choice"
        return Health.UP, f"one-token completion ({settings.llm_json_mode.value} JSON mode) from {shown_url(base_url)}"

    try:
        probe = await _timed(service, timeout_s + 1.0, work)
    finally:
        await client.close()
    if probe.timed_out:
        busy = await _calls_in_flight(settings, endpoint_name(base_url))
        if busy:
            return Probe(service, Health.BUSY, f"no free slot within {timeout_s:.0f}s: {busy} worker call(s) "
                         "in flight", probe.seconds)
    return probe


async def probe_embedder(settings: Settings) -> Probe:
    from epistream.models.embeddings import Embedder

    def embed() -> tuple[Health, str]:
        vector = Embedder.from_settings(settings).embed(["Is the memory healthy?"])[0]
        norm = math.sqrt(float((vector * vector).sum()))
        if not math.isfinite(norm) or norm == 0.0:
            return Health.DOWN, f"degenerate embedding (norm {norm})"
        return Health.UP, f"one sentence embedded by {settings.embedding_model} ({vector.shape[0]} dimensions)"

    # Loading the model takes a few seconds on a busy machine: a longer budget than the others.
    return await _timed("embedder", settings.health_timeout_s * 3, lambda: asyncio.to_thread(embed))


async def probe_worker(settings: Settings, worker: str, *, pid: int | None = None) -> Probe:
    group = worker_group(settings, worker)

    async def work() -> tuple[Health, str]:
        samples = await asyncio.to_thread(read_samples, worker_metrics_url(settings, worker), 3.0)
        if not any(s.name.startswith("epistream_") for s in samples):
            return Health.DOWN, "its /metrics has no epistream metric"
        state, members = await group_members(settings, group)
        if pid is not None:
            mine = [m for m in members if m.client_id == worker_client_id(worker, pid=pid)]
        else:  # no supervisor to ask (a container): any worker of this host
            mine = [m for m in members if m.client_id.startswith(worker_client_prefix(worker))]
        if mine:
            return Health.UP, f"/metrics served; member of {group} ({state}, {mine[0].partitions} partitions)"
        if state in ("PreparingRebalance", "CompletingRebalance"):
            return Health.BUSY, f"/metrics served; {group} is rebalancing"
        return Health.DOWN, f"/metrics served, but not a member of {group} (state {state}, {len(members)} members)"

    return await _timed(f"worker-{worker}", settings.health_timeout_s, work)


async def probe_all(
    settings: Settings, *, worker_pids: Mapping[str, int | None] | None = None, only: set[str] | None = None
) -> list[Probe]:
    """Every probe at once; `only` keeps the named services (kafka, postgres, model-server, embedder, worker-*)."""
    endpoints = model_endpoints(settings)
    probes: dict[str, Callable[[], Awaitable[Probe]]] = {
        "kafka": lambda: probe_kafka(settings),
        "postgres": lambda: probe_postgres(settings),
    }
    for url in endpoints:
        name = "model-server" if len(endpoints) == 1 else f"model {endpoint_name(url)}"
        probes[name] = partial(probe_model, settings, url, service=name)
    probes["embedder"] = lambda: probe_embedder(settings)
    for worker in WORKERS:
        pid = (worker_pids or {}).get(worker)
        probes[f"worker-{worker}"] = partial(probe_worker, settings, worker, pid=pid)
    chosen = [name for name in probes if only is None or name in only]
    return list(await asyncio.gather(*(probes[name]() for name in chosen)))
