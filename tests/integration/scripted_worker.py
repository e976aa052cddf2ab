"""A worker process of its own for kafka-tier tests: its own topics, consumer group and database
(one deployment, one memory: the stack's worker must not see, close or enrich its conversations),
with its model calls answered by a scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from epistream.kafka_io import ensure_topics
from epistream.readiness import port_open
from epistream.settings import Settings
from infra.process import ManagedProcess, wait_until
from tests.support.scripted_llm import Reply, ScriptedLLM

from .conftest import drop_database, own_database


@dataclass(frozen=True)
class Scripted:
    settings: Settings
    db_url: str
    process: ManagedProcess


@contextmanager
def scripted_worker(stack: Settings, script: Callable[[dict], Reply], *, metrics_port: int, name: str = "scripted",
                    worker: str = "ingest", overrides: dict[str, Any] | None = None) -> Iterator[Scripted]:
    """Start `epistream worker <worker>` on fresh topics and a fresh database; stop it and drop both after."""
    suffix = uuid.uuid4().hex[:8]
    database = f"{name}_{suffix}"
    url = own_database(stack, database)
    with ScriptedLLM(script) as server:
        own = {
            "database_url": url,
            "topic_turns": f"{name}-{suffix}.turns", "topic_segments": f"{name}-{suffix}.segments",
            "topic_questions": f"{name}-{suffix}.questions", "topic_answers": f"{name}-{suffix}.answers",
            "topic_dlq": f"{name}-{suffix}.dlq", "indexer_group": f"{name}-{suffix}",
            "ingest_metrics_port": metrics_port, "extractor_base_url": server.base_url, "llm_max_retries": 1,
        } | (overrides or {})
        settings = stack.with_overrides(**(own | {"database_url": SecretStr(url)}))
        asyncio.run(ensure_topics(settings))
        env = dict(os.environ) | {f"EPISTREAM_{k.upper()}": str(v) for k, v in own.items()}
        process = ManagedProcess(f"worker-{name}-{suffix}", stack.state_dir)
        process.spawn([sys.executable, "-m", "epistream.shell.cli", "worker", worker], env=env)
        try:
            wait_until(lambda: port_open("127.0.0.1", metrics_port), timeout=60, what=f"{name} worker",
                       log_file=process.log_file)
            yield Scripted(settings, url, process)
        finally:
            process.stop()
            drop_database(stack, database)
