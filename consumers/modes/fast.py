"""`fast` answering: the best gists, facts and turns in one master call, with the excerpts it cites."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from epistream.contracts import Evidence, Question
from epistream.db import tenant_scope
from epistream.prompts import fence

from ..context import ContextItem, gist_and_fact_items, turn_item
from ..deps import AnswerDeps
from ..prompts import ANSWER_PROMPT
from ..retrieval import search_turns
from .base import Abstention, ModeResult, model_text


def format_excerpts(items: list[ContextItem], max_chars: int) -> str:
    """Numbered, dated excerpts, cut to the prompt budget (never below one)."""
    lines, used = [], 0
    for number, item in enumerate(items, start=1):
        line = f"[{number}] {item.line}"
        if used + len(line) > max_chars and lines:
            break
        lines.append(line)
        used += len(line)
    return "\n".join(lines)


def build_messages(question: Question, items: list[ContextItem], max_chars: int) -> list[dict[str, str]]:
    asked = (question.asked_at or datetime.now(UTC)).strftime("%Y-%m-%d")
    user = (
        f"{fence('memory', format_excerpts(items, max_chars))}\n\n"
        f"Today is {asked}. Question: {question.question}"
    )
    return [{"role": "system", "content": ANSWER_PROMPT.template}, {"role": "user", "content": user}]


def evidence_from(items: list[ContextItem], chosen: list[int], fallback: int = 3) -> list[Evidence]:
    """The excerpts the model cited (only numbers that exist); else the first ones."""
    picked = [items[n - 1] for n in dict.fromkeys(chosen) if 1 <= n <= len(items)]
    return [item.evidence for item in (picked or items[:fallback])]


async def answer_fast(question: Question, deps: AnswerDeps) -> ModeResult:
    """One step: the best gists, the facts about named entities and the best turns, in one master call."""
    settings = deps.settings
    vector = (await asyncio.to_thread(deps.embedder.embed, [question.question]))[0]
    async with deps.pool.connection() as conn, tenant_scope(conn, question.tenant):
        turns = await search_turns(conn, tenant=question.tenant, query=question.question, vector=vector,
                                   conversation_ids=question.conversation_ids, recipe=deps.recipes.turns)
        structured = await gist_and_fact_items(conn, tenant=question.tenant, question=question.question,
                                               vector=vector, conversation_ids=question.conversation_ids)
    # Gists and facts first (dense, dated), then the turns in time order, as the conversation read.
    items = structured + [turn_item(t) for t in sorted(turns, key=lambda t: t.ts)]
    if not items:
        return ModeResult.abstain(Abstention.NO_MEMORY)
    reply = await deps.master.complete_json(
        build_messages(question, items, settings.answer_context_chars), ANSWER_PROMPT.schema,
        max_tokens=settings.llm_max_tokens,
    )
    return ModeResult(
        answer=model_text(reply.value.answer),
        abstained=reply.value.abstain,
        evidence=[] if reply.value.abstain else evidence_from(items, reply.value.evidence),
        master=reply.usage,
    )
