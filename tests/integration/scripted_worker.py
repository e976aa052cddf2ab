"""A worker process of its own for kafka-tier tests: a deployment of its own (topics, consumer
groups and database, tests/integration/deployments.py: the stack's worker must not see, close or
enrich its conversations), with its model calls answered by a scripted OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epistream.infra.process import ManagedProcess
from epistream.settings.processes import Settings
from epistream.testing.scripted_llm import Reply, ScriptedLLM

from .deployments import Deployment, deployments


def no_model_call(body: dict) -> Reply:
    """The script of a deployment that must call no model (storing turns, reading context)."""
    return 500, "this deployment must not call a model"


#: Each worker's metrics port, as an offset from the port the caller gives.
PORT_OFFSET = {"ingest": 0, "enrich": 1, "answer": 2}


@dataclass
class Scripted:
    settings: Settings
    db_url: str  # the owner's login, for the test's own inspection
    processes: dict[str, ManagedProcess]
    server: ScriptedLLM  # the one running now: a test may stop it and start another on the same port
    deployment: Deployment | None = None  # its environment, for processes a test starts itself

    @property
    def process(self) -> ManagedProcess:
        return next(iter(self.processes.values()))


@contextmanager
def scripted_worker(stack: Settings, script: Callable[[dict], Reply], *, metrics_port: int, name: str = "scripted",
                    workers: Sequence[str] = ("ingest",), overrides: dict[str, Any] | None = None,
                    cwd: Path | None = None) -> Iterator[Scripted]:
    """Start `epistream worker <w>` for each of `workers` on a fresh deployment (from `cwd`); stop them and
    drop its database after. The topics keep the stack's partition counts unless `overrides` say otherwise."""
    server = ScriptedLLM(script).__enter__()
    own = {"turns_partitions": stack.turns_partitions, "questions_partitions": stack.questions_partitions,
           "extractor_base_url": server.base_url, "llm_max_retries": 1} | (overrides or {})
    running = Scripted(stack, "", {}, server)
    try:
        with deployments(stack, 1, name=name, **own) as (deployment,):
            running.settings, running.db_url, running.deployment = deployment.settings, deployment.admin_url, deployment
            try:
                for worker in workers:
                    running.processes[worker] = deployment.run(worker, metrics_port + PORT_OFFSET[worker], cwd=cwd)
                yield running
            finally:
                for process in running.processes.values():
                    process.stop()
    finally:
        running.server.__exit__(None, None, None)
