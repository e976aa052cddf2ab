"""Whole deployments for the tests that run real worker processes: each has its own topics, consumer
groups and database(s) on the test stack's Kafka and PostgreSQL, and runs the product's own CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from epistream.infra.process import ManagedProcess, wait_until
from epistream.infra.stack import worker_argv
from epistream.messaging.topics import ensure_topics
from epistream.ops.readiness import port_open
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url, database_url, on_database

from .conftest import count_turns, drop_database, own_database

BASE_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 30  # beside the test stack's ports
TOPICS = ("turns", "segments", "questions", "answers", "dlq", "forgotten", "events")
PORT_OF = {"ingest": "EPISTREAM_INGEST_METRICS_PORT", "answer": "EPISTREAM_ANSWER_METRICS_PORT",
           "enrich": "EPISTREAM_ENRICH_METRICS_PORT"}


@dataclass
class Deployment:
    """One memory: its database and the environment of the processes that serve it."""

    settings: Settings
    env: dict[str, str]
    name: str

    @property
    def admin_url(self) -> str:
        """The owner's login to this deployment's database, for the test's own inspection."""
        return admin_database_url(self.settings)

    def run(self, worker: str, port: int, *, cwd: Path | None = None, env: Mapping[str, str] | None = None
            ) -> ManagedProcess:
        """`epistream worker <worker>` as the embedded stack starts it (from `cwd`, with `env` added to the
        deployment's), waited for until its /metrics answers."""
        process = ManagedProcess(f"worker-{worker}-{self.name}", self.settings.state_dir)
        process.spawn(worker_argv(worker), env=self.env | dict(env or {}) | {PORT_OF[worker]: str(port)}, cwd=cwd)
        wait_until(lambda: port_open("127.0.0.1", port), timeout=120, what=f"{worker} worker",
                   log_file=process.log_file)
        return process

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-P", "-m", "epistream.apps.cli.main", *args], env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)

    def turns(self, tenant: str, conversation: str) -> int:
        return count_turns(self.admin_url, tenant, conversation)


def as_env(value: object) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


@contextmanager
def deployments(kafka: Settings, count: int, *, name: str = "dep", **overrides: object) -> Iterator[list[Deployment]]:
    """`count` deployments on one set of fresh topics (a memory and its rebuilds), each with its own
    database and consumer groups; `overrides` are settings every process of them gets."""
    suffix = uuid.uuid4().hex[:8]
    shared = {f"topic_{t}": f"{name}-{suffix}.{t}" for t in TOPICS} | {"turns_partitions": 2,
                                                                       "questions_partitions": 1} | overrides
    base = kafka.with_overrides(**shared)
    asyncio.run(ensure_topics(base))
    made: list[Deployment] = []
    try:
        for n in range(1, count + 1):
            database = f"{name}_{suffix}_{n}"
            groups = {"indexer_group": f"{name}-{suffix}-{n}", "enrich_group": f"{name}-{suffix}-enrich-{n}",
                      "answer_group": f"{name}-{suffix}-answer-{n}"}
            settings = on_database(base.with_overrides(**groups), own_database(kafka, database))
            env = dict(os.environ) | {f"EPISTREAM_{k.upper()}": as_env(v) for k, v in (shared | groups).items()} | {
                "EPISTREAM_DATABASE_URL": database_url(settings),
                "EPISTREAM_DATABASE_ADMIN_URL": admin_database_url(settings)}
            made.append(Deployment(settings, env, database))
        yield made
    finally:
        for deployment in made:
            drop_database(kafka, deployment.name)
