"""The demo: stream the shipped sample conversation, wait until it is searchable,
ask its questions through Kafka and print the answers with their evidence."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from ..client import ask, produce_raw
from ..contracts import Mode, Question, Turn
from ..db import admin_database_url
from ..readiness import wait_for_turns
from ..settings import Settings
from .output import fail_loudly, print_answer, print_rows, unhealthy

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
SAMPLE_CONVERSATION = DATA_DIR / "sample_conversation.jsonl"
SAMPLE_QUESTIONS = DATA_DIR / "sample_questions.json"


def sample_turns() -> list[Turn]:
    return [Turn.model_validate_json(line) for line in SAMPLE_CONVERSATION.read_text().splitlines() if line.strip()]


def wait_until_stored(settings: Settings, turns: list[Turn], timeout_s: float = 120.0) -> float:
    """Block until every turn is in PostgreSQL; return the seconds it took."""
    started = time.monotonic()
    wait_for_turns(admin_database_url(settings), turns[0].tenant, len(turns), conversation_id=turns[0].conversation_id,
                   turn_ids=[t.turn_id for t in turns], timeout_s=timeout_s)
    return time.monotonic() - started


def run_demo(settings: Settings, *, start: bool = True, mode: Mode = Mode.FAST) -> int:
    """0 when every question got a live answer; 1, naming the unhealthy service, at the first that did not."""
    from ..errors import ServiceError

    if start:
        from epistream.infra import services

        try:
            print_rows(services.up(settings))
        except ServiceError as exc:
            print(f"epistream is not healthy: {exc}", file=sys.stderr)
            return 1
    elif bad := unhealthy(settings):
        return fail_loudly(settings, "the running stack is not healthy", bad=bad)
    turns = sample_turns()
    records = [(t.conversation_id.encode(), t.to_bytes()) for t in turns]
    asyncio.run(produce_raw(settings, records))
    print(f"\nproduced {len(turns)} turns of {turns[0].conversation_id!r} to {settings.topic_turns}")
    print(f"all of them searchable after {wait_until_stored(settings, turns):.2f}s")
    # Questions are asked "now" in the conversation's world: the day after its last turn.
    asked_at = max(t.ts for t in turns).astimezone(UTC).replace(hour=12, minute=0)
    for item in json.loads(SAMPLE_QUESTIONS.read_text()):
        question = Question(
            question_id=f"demo-{uuid.uuid4()}", tenant=turns[0].tenant, question=item["question"],
            conversation_ids=[turns[0].conversation_id], asked_at=asked_at, mode=mode,
        )
        try:
            answer = asyncio.run(ask(settings, question))
        except TimeoutError as exc:
            return fail_loudly(settings, f"no answer: {exc}")
        print_answer(answer, item["question"])
        if answer.error:
            return fail_loudly(settings, f"the answer failed: {answer.error}")
        print(f"   expected: {item['expected'] if item['expected'] is not None else '(unanswerable: abstain)'}")
    print(f"\ndone at {datetime.now(UTC):%H:%M:%S}; `epistream down` stops the services.")
    return 0
