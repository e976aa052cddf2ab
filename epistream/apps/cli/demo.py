"""The demo: stream the shipped sample conversation, wait until it is searchable, then for each of
its questions print first the `context` read (the memory an agent's own model would get: no model
call, milliseconds) and then the answer of the configured model, with its evidence."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from epistream.apps.cli.output import fail_loudly, print_answer, print_rows, unhealthy
from epistream.client.api import produce_raw
from epistream.client.session import EpistreamClient
from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import MemoryContext
from epistream.contracts.turns import Turn
from epistream.ops.readiness import wait_for_turns
from epistream.settings.processes import Settings
from epistream.storage.db import admin_database_url

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
SAMPLE_CONVERSATION = DATA_DIR / "sample_conversation.jsonl"
SAMPLE_QUESTIONS = DATA_DIR / "sample_questions.json"
#: The demo's `context` budget: small enough that the lines printed are the whole read.
DEMO_BUDGET_TOKENS = 200


def sample_turns() -> list[Turn]:
    return [Turn.model_validate_json(line) for line in SAMPLE_CONVERSATION.read_text().splitlines() if line.strip()]


def sample_questions() -> list[dict]:
    """Each question with its expected answer and the turns that hold the evidence for it."""
    return json.loads(SAMPLE_QUESTIONS.read_text())


def asked_at_for(turns: list[Turn]) -> datetime:
    """Questions are asked "now" in the conversation's world: noon of the day of its last turn."""
    return max(t.ts for t in turns).astimezone(UTC).replace(hour=12, minute=0)


def print_context(reply: MemoryContext) -> None:
    print(f"   memory ({len(reply.items)} items, {reply.used_tokens}/{reply.budget_tokens} tokens, "
          f"{reply.latency_ms:.0f} ms, no model call):")
    for line in reply.text.splitlines():
        print(f"     {line}")
    for period in reply.resolved:
        print(f"   read \"{period.expression}\" as {period.start} .. {period.end}")


def model_label(settings: Settings) -> str:
    """Who answers, said plainly: the embedded model is a 135M one on CPU, there to show the path."""
    if settings.model_server_embedded and settings.llm_base_url.startswith(f"http://127.0.0.1:{settings.model_server_port}"):
        return (f"the embedded {settings.llm_model} (a 135M model on CPU: it shows the path, not the quality; "
                "EPISTREAM_LLM_BASE_URL points answers at a real model)")
    return f"{settings.llm_model} at {settings.llm_base_url}"


def wait_until_stored(settings: Settings, turns: list[Turn], timeout_s: float = 120.0) -> float:
    """Block until every turn is in PostgreSQL; return the seconds it took."""
    started = time.monotonic()
    wait_for_turns(admin_database_url(settings), turns[0].tenant, len(turns), conversation_id=turns[0].conversation_id,
                   turn_ids=[t.turn_id for t in turns], timeout_s=timeout_s)
    return time.monotonic() - started


def run_demo(settings: Settings, *, start: bool = True, mode: Mode = Mode.FAST) -> int:
    """0 when every question got a live answer; 1, naming the unhealthy service, at the first that did not."""
    from epistream.errors import ServiceError

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
    return asyncio.run(_ask_each(settings, turns, mode))


async def _ask_each(settings: Settings, turns: list[Turn], mode: Mode) -> int:
    """Each sample question's context read, then its answer, through one client for the whole demo."""
    asked_at = asked_at_for(turns)
    label = model_label(settings)
    async with EpistreamClient(settings) as client:
        for item in sample_questions():
            print(f"\nQ: {item['question']}")
            try:
                memory = await client.context(tenant=turns[0].tenant, question=item["question"],
                                              conversation_ids=[turns[0].conversation_id], asked_at=asked_at,
                                              budget_tokens=DEMO_BUDGET_TOKENS)
            except TimeoutError as exc:
                return fail_loudly(settings, f"no context: {exc}")
            if memory.error:
                return fail_loudly(settings, f"the context read failed: {memory.error}")
            print_context(memory)
            question = Question(
                question_id=f"demo-{uuid.uuid4()}", tenant=turns[0].tenant, question=item["question"],
                conversation_ids=[turns[0].conversation_id], asked_at=asked_at, mode=mode,
            )
            try:
                answer = await client.ask(question)
            except TimeoutError as exc:
                return fail_loudly(settings, f"no answer: {exc}")
            print(f"   answer from {label}:")
            print_answer(answer)
            if answer.error:
                return fail_loudly(settings, f"the answer failed: {answer.error}")
            print(f"   expected: {item['expected'] if item['expected'] is not None else '(unanswerable: abstain)'}")
    print(f"\ndone at {datetime.now(UTC):%H:%M:%S}; `epistream down` stops the services.")
    return 0
