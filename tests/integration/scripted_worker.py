"""A worker process of its own for kafka-tier tests: its own topics, consumer group and database
(one deployment, one memory: the stack's worker must not see, close or enrich its conversations),
with its model calls answered by a scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from epistream.db import database_url, on_database
from epistream.readiness import port_open
from epistream.settings import Settings
from epistream.topics import ensure_topics
from infra.process import ManagedProcess, wait_until
from tests.support.scripted_llm import Reply, ScriptedLLM

from .conftest import drop_database, own_database

#: Each worker's metrics port, as an offset from the port the caller gives.
PORT_OFFSET = {"ingest": 0, "enrich": 1, "answer": 2}


@dataclass
class Scripted:
    settings: Settings
    db_url: str
    processes: dict[str, ManagedProcess]
    server: ScriptedLLM  # the one running now: a test may stop it and start another on the same port

    @property
    def process(self) -> ManagedProcess:
        return next(iter(self.processes.values()))


@contextmanager
def scripted_worker(stack: Settings, script: Callable[[dict], Reply], *, metrics_port: int, name: str = "scripted",
                    workers: Sequence[str] = ("ingest",), overrides: dict[str, Any] | None = None,
                    ) -> Iterator[Scripted]:
    """Start `epistream worker <w>` for each of `workers` on fresh topics, groups and a fresh database;
    stop them and drop the database after."""
    suffix = uuid.uuid4().hex[:8]
    database = f"{name}_{suffix}"
    url = own_database(stack, database)
    server = ScriptedLLM(script).__enter__()
    own = {
        "topic_turns": f"{name}-{suffix}.turns", "topic_segments": f"{name}-{suffix}.segments",
        "topic_questions": f"{name}-{suffix}.questions", "topic_answers": f"{name}-{suffix}.answers",
        "topic_dlq": f"{name}-{suffix}.dlq", "indexer_group": f"{name}-{suffix}",
        "enrich_group": f"{name}-{suffix}-enrich", "answer_group": f"{name}-{suffix}-answer",
        "ingest_metrics_port": metrics_port + PORT_OFFSET["ingest"],
        "enrich_metrics_port": metrics_port + PORT_OFFSET["enrich"],
        "answer_metrics_port": metrics_port + PORT_OFFSET["answer"],
        "extractor_base_url": server.base_url, "llm_max_retries": 1,
    } | (overrides or {})
    settings = on_database(stack.with_overrides(**own), url)  # the workers log in as epistream_worker
    asyncio.run(ensure_topics(settings))
    env = dict(os.environ) | {f"EPISTREAM_{k.upper()}": str(v) for k, v in own.items()} | {
        "EPISTREAM_DATABASE_URL": database_url(settings), "EPISTREAM_DATABASE_ADMIN_URL": url}
    running = Scripted(settings, url, {}, server)
    try:
        for worker in workers:
            process = ManagedProcess(f"worker-{name}-{worker}-{suffix}", stack.state_dir)
            process.spawn([sys.executable, "-m", "epistream.shell.cli", "worker", worker], env=env)
            running.processes[worker] = process
            port = metrics_port + PORT_OFFSET[worker]
            wait_until(lambda port=port: port_open("127.0.0.1", port), timeout=60, what=f"{name} {worker} worker",
                       log_file=process.log_file)
        yield running
    finally:
        for process in running.processes.values():
            process.stop()
        running.server.__exit__(None, None, None)
        drop_database(stack, database)
