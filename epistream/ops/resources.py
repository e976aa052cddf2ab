"""The composition root: every process builds its shared clients here, from its settings, and
passes them down. `Resources` opens the Postgres pools (the primary's, and the read pool: a hot
standby's when one is configured) and the embedder and hands out model clients;
`model_client` decides a role's endpoint, model, timeout, retries and restart wait in one place.
(The Kafka producer is `epistream.messaging.kafka_io.create_producer`: Faust builds the indexer's own.)"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack

from psycopg_pool import AsyncConnectionPool

from epistream.core.metrics import Metrics
from epistream.models.embeddings import Embedder
from epistream.models.llm import ModelClient, create_client
from epistream.settings.models import JsonMode
from epistream.settings.processes import Settings
from epistream.storage.db import open_pool, read_database_url

Role = Literal["master", "extractor", "assistant", "judge"]


class ModelOverrides(TypedDict, total=False):
    """What a caller may set instead of the role's defaults (model_client's keywords)."""

    base_url: str | None
    model: str | None
    timeout_s: float | None
    json_mode: JsonMode | None


def model_client(
    settings: Settings,
    role: Role,
    metrics: Metrics,
    *,
    base_url: str | None = None,
    model: str | None = None,
    timeout_s: float | None = None,
    json_mode: JsonMode | None = None,
) -> ModelClient:
    """One role's client. The role picks the defaults: the master uses the LLM endpoint, the
    extractor its own endpoint, model and longer timeout, an assistant the endpoint it is given."""
    if role == "extractor":
        url, name, timeout = settings.extractor_url, settings.extractor_model_name, settings.extractor_timeout_s
    elif role == "assistant":
        url, name, timeout = settings.llm_base_url, settings.assistant_model or settings.llm_model, settings.llm_timeout_s
    else:
        url, name, timeout = settings.llm_base_url, settings.llm_model, settings.llm_timeout_s
    return ModelClient(
        create_client(settings, base_url=base_url or url, timeout_s=timeout_s or timeout),
        role=role, model=model or name, json_mode=json_mode or settings.llm_json_mode, metrics=metrics,
        max_retries=settings.llm_max_retries, restart_wait_s=settings.llm_restart_wait_s,
    )


@dataclass
class Resources:
    """What a worker process shares between its stages: the pools, one embedder, one metrics registry.
    Built once in the process's entry point (`open`), closed once at its end (`close`)."""

    settings: Settings
    metrics: Metrics
    pool: AsyncConnectionPool
    embedder: Embedder
    #: Where the process's reads go: a pool on the hot standby EPISTREAM_DATABASE_READ_URL names, else
    #: `pool` itself. Read-your-own-writes holds on it: the ingest watermark replicates in the transaction
    #: of its turns, so a mark read there promises those turns there (docs/read-your-writes.md).
    read_pool: AsyncConnectionPool

    @classmethod
    async def open(cls, settings: Settings, metrics: Metrics | None = None, *, standby_reads: bool = True) -> Resources:
        """`standby_reads=False`: a process whose reads must see its own writes at once (the pipeline's
        workers) reads from the primary even when a standby is configured."""
        pool = await open_pool(settings)
        read_url = read_database_url(settings) if standby_reads else None
        read_pool = pool
        try:
            if read_url:
                read_pool = await open_pool(settings, url=read_url, name="epistream-reads")
            # Fetching, checking (sha256) and loading the model takes seconds: off the event loop, whose
            # pools and Kafka clients keep their heartbeats meanwhile.
            embedder = await asyncio.to_thread(Embedder.from_settings, settings)
        except BaseException:
            if read_pool is not pool:
                await read_pool.close()
            await pool.close()
            raise
        return cls(settings, metrics or Metrics.create(), pool, embedder, read_pool)

    def model(self, role: Role, **overrides: Unpack[ModelOverrides]) -> ModelClient:
        return model_client(self.settings, role, self.metrics, **overrides)

    def assistants(self) -> list[ModelClient]:
        """One client per assistant endpoint (the LLM endpoint when none is configured)."""
        return [self.model("assistant", base_url=url) for url in self.settings.assistant_urls]

    async def close(self) -> None:
        if self.read_pool is not self.pool:
            await self.read_pool.close()
        await self.pool.close()
