"""kill -9 of each embedded service and worker: the supervisor brings it back, `status` says
what happened, and a turn produced and a question asked while it was gone are not lost.

These tests disturb the shared stack, so the conftest runs them after every other test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from aiokafka.errors import KafkaError

from epistream.client.api import ask, produce_raw
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import Answer
from epistream.infra import services

from .conftest import count_turns, wait_for
from .helpers import make_turns

pytestmark = [pytest.mark.integration, pytest.mark.disruptive]

SERVICES = ["worker-ingest", "worker-enrich", "worker-answer", "model-server", "postgres", "kafka"]


def _retrying(what: str, call, timeout_s: float = 240.0):  # type: ignore[no-untyped-def]
    """What a client does while the broker restarts: try again until it is back."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except (KafkaError, OSError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} kept failing: {exc!r}") from exc
            time.sleep(1.0)


def _record_restart(settings, service: str, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """Kept beside the test stack, for the figures in docs/operations.md."""
    path = settings.state_dir / "restart-times.json"
    times = json.loads(path.read_text()) if path.exists() else {}
    times[service] = round(seconds, 1)
    path.write_text(json.dumps(times, indent=1))


@pytest.mark.parametrize("service", SERVICES)
def test_kill_9_is_restarted_and_nothing_produced_meanwhile_is_lost(stack, db_url, unique, service):
    tenant, conversation = unique("supervised"), unique(service)
    turns = make_turns(tenant, conversation, [("Ada", f"I moved my piano lessons to Thursdays ({service}).")])
    question = Question(question_id=f"q-{uuid.uuid4()}", tenant=tenant, question="When are the piano lessons?",
                        conversation_ids=[conversation], asked_at=datetime.now(UTC), mode=Mode.FAST)
    before = {row.name: row for row in services.status(stack)}[service]
    old_pid = services.service_pid(stack, service)
    assert old_pid is not None

    os.kill(old_pid, signal.SIGKILL)
    killed = time.monotonic()
    with ThreadPoolExecutor(2) as meanwhile:
        produced = meanwhile.submit(_retrying, "producing a turn", lambda: asyncio.run(
            produce_raw(stack, [(t.conversation_id.encode(), t.to_bytes()) for t in turns])))
        answered = meanwhile.submit(_retrying, "asking a question", lambda: asyncio.run(
            ask(stack, question, timeout_s=300)))
        new_pid = services.wait_restarted(stack, service, old_pid)
        _record_restart(stack, service, time.monotonic() - killed)
        assert produced.result(timeout=300) == 1
        answer: Answer = answered.result(timeout=400)

    assert new_pid != old_pid
    assert answer.question_id == question.question_id and answer.error is None
    wait_for(lambda: count_turns(db_url, tenant, conversation) == 1, timeout=240, what="the turn stored")
    after = wait_for(lambda: (row := {r.name: r for r in services.status(stack)}[service]).running and row,
                     timeout=120, what=f"{service} healthy again")
    assert after.restarts == before.restarts + 1
    assert "last killed by SIGKILL" in after.detail
