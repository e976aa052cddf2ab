"""An answer worker process of a test's own: its topics, consumer group and database, its models
pointed at a scripted OpenAI-compatible server, started (and killed) by the test. Replies are read as
the product's readers read them: read_committed."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from epistream.client.api import produce_raw
from epistream.contracts.dead_letters import DeadLetter
from epistream.contracts.questions import Question
from epistream.contracts.replies import Answer
from epistream.infra.process import ManagedProcess, wait_until
from epistream.messaging.topics import ensure_topics
from epistream.ops.readiness import port_open
from epistream.settings.processes import Settings
from epistream.storage.db import database_url, on_database
from epistream.testing.scripted_llm import Reply, ScriptedLLM

from .conftest import drop_database, own_database, read_topic

BASE_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 20  # beside the test stack's ports


@dataclass
class AnswerEnv:
    settings: Settings
    env: dict[str, str]
    master: Any  # the test's scripted model (its own attributes: release events, counters)
    suffix: str
    port_base: int

    def spawn(self, n: int) -> ManagedProcess:
        port = self.port_base + n
        process = ManagedProcess(f"worker-answer-scripted-{self.suffix}-{n}", self.settings.state_dir)
        process.spawn([sys.executable, "-P", "-m", "epistream.apps.cli.main", "worker", "answer"],
                      env=self.env | {"EPISTREAM_ANSWER_METRICS_PORT": str(port)})
        wait_until(lambda: port_open("127.0.0.1", port), timeout=90, what="scripted answer worker",
                   log_file=process.log_file)
        return process

    def ask(self, *questions: Question) -> None:
        asyncio.run(produce_raw(self.settings, [(q.question_id.encode(), q.to_bytes()) for q in questions],
                                topic=self.settings.topic_questions))

    def answers(self, question_id: str, *, topic: str | None = None, want: int = 1, timeout: float = 90) -> list[Answer]:
        found = asyncio.run(read_topic(self.settings, topic or self.settings.topic_answers,
                                       lambda k, v: k == question_id.encode(), want=want, timeout=timeout))
        return [Answer.from_bytes(r.value) for r in found]

    def answers_then_quiet(self, question_id: str, *, timeout: float = 90, quiet_s: float = 10) -> list[Answer]:
        """Every answer to the question: waits for the first (up to `timeout`), then `quiet_s` more for a
        second one to show up, instead of a whole timeout spent waiting for what should never come."""
        if not self.answers(question_id, timeout=timeout):
            return []
        return self.answers(question_id, want=2, timeout=quiet_s)

    def replies(self, match: Callable[[bytes | None, bytes | None], bool], *, want: int, timeout: float = 90) -> list:
        """Every committed reply record `match` accepts (until `want` of them, or the timeout)."""
        return asyncio.run(read_topic(self.settings, self.settings.topic_answers, match, want=want, timeout=timeout))

    def letters(self, question_id: str, *, timeout: float = 60) -> list[DeadLetter]:
        found = asyncio.run(read_topic(self.settings, self.settings.topic_dlq,
                                       lambda k, v: k == question_id.encode(), timeout=timeout))
        return [DeadLetter.model_validate_json(r.value) for r in found]


@contextmanager
def scripted_answer_env(kafka: Settings, master: Callable[[dict], Reply], name: str, *, partitions: int,
                        port_offset: int = 0, **settings: Any) -> Iterator[AnswerEnv]:
    """Topics `<name>-<suffix>.*` with `partitions` question partitions, a database of their own, and
    the `master` script serving every model role; workers are started by `AnswerEnv.spawn`."""
    suffix = uuid.uuid4().hex[:8]
    database = f"{name}_{suffix}"
    url = own_database(kafka, database)
    with ScriptedLLM(master) as server:
        overrides = {
            "topic_turns": f"{name}-{suffix}.turns", "topic_segments": f"{name}-{suffix}.segments",
            "topic_questions": f"{name}-{suffix}.questions", "topic_answers": f"{name}-{suffix}.answers",
            "topic_dlq": f"{name}-{suffix}.dlq", "answer_group": f"{name}-{suffix}", "questions_partitions": partitions,
            "llm_base_url": server.base_url, "assistant_base_urls": server.base_url, "llm_max_retries": 0,
        } | settings
        own = on_database(kafka.with_overrides(**overrides), url)
        asyncio.run(ensure_topics(own))
        env = dict(os.environ) | {f"EPISTREAM_{k.upper()}": str(v) for k, v in overrides.items()} | {
            "EPISTREAM_DATABASE_URL": database_url(own), "EPISTREAM_DATABASE_ADMIN_URL": url}
        try:
            yield AnswerEnv(own, env, master, suffix, BASE_PORT + port_offset)
        finally:
            drop_database(kafka, database)
