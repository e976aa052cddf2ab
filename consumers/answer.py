"""`fast` answering: retrieve the best turns, ask the master model once, attach evidence."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from psycopg_pool import AsyncConnectionPool

from epistream.contracts import Answer, Evidence, Mode, Question, RoleTokens
from epistream.db import tenant_scope
from epistream.embeddings import Embedder
from epistream.llm import ModelClient, Usage
from epistream.metrics import Metrics
from epistream.settings import Settings

from .assistants import AssistantPool
from .context import ContextItem, gist_and_fact_items, turn_item
from .deep import answer_deep
from .prompts import ANSWER_PROMPT_VERSION, MasterAnswer, load_prompt
from .retrieve import search_turns
from .router import RouterConfig

log = logging.getLogger(__name__)

ROLES = ("master", "assistant", "extractor")
NO_MEMORY_ANSWER = "I don't know: nothing in this memory is about that."


@dataclass(frozen=True)
class AnswerDeps:
    settings: Settings
    pool: AsyncConnectionPool
    embedder: Embedder
    master: ModelClient
    metrics: Metrics
    assistants: AssistantPool
    router: RouterConfig


def router_config(settings: Settings) -> RouterConfig:
    fusion = "rrf" if settings.router_fusion == "rrf" else "minmax"
    return RouterConfig(top_k=settings.router_top_k, candidates=settings.router_candidates, fusion=fusion,
                        weights=settings.pathway_weights, force_include=settings.router_force_include,
                        rrf_k=settings.rrf_k)


# Questions about when, how often, in which order: the structured tools answer those exactly.
_STRUCTURED = re.compile(
    r"\b(when|what (?:year|month|date|day)|how (?:many|often|long)|first|last|before|after|since|until|"
    r"count|times|ago)\b", re.IGNORECASE)


def choose_mode(question: Question) -> Mode:
    """`auto`: the structured tool loop for temporal and counting questions, assistants otherwise."""
    if question.mode is not Mode.AUTO:
        return question.mode
    return Mode.AGENTIC if _STRUCTURED.search(question.question) else Mode.DEEP


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
        f"<memory>\n{format_excerpts(items, max_chars)}\n</memory>\n\n"
        f"Today is {asked}. Question: {question.question}"
    )
    return [{"role": "system", "content": load_prompt(ANSWER_PROMPT_VERSION)}, {"role": "user", "content": user}]


def evidence_from(items: list[ContextItem], chosen: list[int], fallback: int = 3) -> list[Evidence]:
    """The excerpts the model cited (only numbers that exist); else the first ones."""
    picked = [items[n - 1] for n in dict.fromkeys(chosen) if 1 <= n <= len(items)]
    return [item.evidence for item in (picked or items[:fallback])]


def _tokens(master: Usage, assistant: Usage | None = None) -> dict[str, RoleTokens]:
    tokens = {role: RoleTokens() for role in ROLES}
    for role, usage in (("master", master), ("assistant", assistant or Usage())):
        tokens[role] = RoleTokens(prompt=usage.prompt_tokens, completion=usage.completion_tokens, calls=usage.calls)
    return tokens


async def answer_question(question: Question, deps: AnswerDeps) -> Answer:
    """Answer in the mode asked for (`auto` picks one); the answer says which ran."""
    mode = choose_mode(question)
    if mode is Mode.AGENTIC:
        from .agentic import answer_agentic  # the tool loop and its SQL tools

        result = await answer_agentic(question, deps)
    elif mode is Mode.DEEP:
        result = await _deep(question, deps)
    else:
        result = await answer_fast(question, deps)
    deps.metrics.questions_answered.labels(result.mode.value, "abstained" if result.abstained else "answered").inc()
    deps.metrics.answer_latency_seconds.labels(result.mode.value).observe(result.latency_ms / 1000)
    return result


async def _deep(question: Question, deps: AnswerDeps) -> Answer:
    started = time.perf_counter()
    result = await answer_deep(question, deps)
    return Answer(
        question_id=question.question_id, tenant=question.tenant, answer=result.answer,
        abstained=result.abstained, evidence=result.evidence, mode=Mode.DEEP, latency_ms=_ms(started),
        tokens=_tokens(result.master, result.assistants),
    )


async def answer_fast(question: Question, deps: AnswerDeps) -> Answer:
    """One step: the best gists, the facts about named entities and the best turns, in one master call."""
    started = time.perf_counter()
    settings = deps.settings
    vector = (await asyncio.to_thread(deps.embedder.embed, [question.question]))[0]
    async with deps.pool.connection() as conn, tenant_scope(conn, question.tenant):
        turns = await search_turns(
            conn,
            tenant=question.tenant,
            query=question.question,
            vector=vector,
            conversation_ids=question.conversation_ids,
            top_k=settings.retrieve_top_k,
            pool=settings.retrieve_pool,
            rrf_k=settings.rrf_k,
        )
        structured = await gist_and_fact_items(conn, tenant=question.tenant, question=question.question,
                                               vector=vector, conversation_ids=question.conversation_ids)
    # Gists and facts first (dense, dated), then the turns in time order, as the conversation read.
    items = structured + [turn_item(t) for t in sorted(turns, key=lambda t: t.ts)]
    if not items:
        result = Answer(
            question_id=question.question_id, tenant=question.tenant, answer=NO_MEMORY_ANSWER, abstained=True,
            evidence=[], mode=Mode.FAST, latency_ms=_ms(started), tokens=_tokens(Usage()),
        )
    else:
        reply = await deps.master.complete_json(
            build_messages(question, items, settings.answer_context_chars), MasterAnswer,
            max_tokens=settings.llm_max_tokens,
        )
        result = Answer(
            question_id=question.question_id,
            tenant=question.tenant,
            answer=reply.value.answer.strip() or "I don't know",
            abstained=reply.value.abstain,
            evidence=[] if reply.value.abstain else evidence_from(items, reply.value.evidence),
            mode=Mode.FAST,
            latency_ms=_ms(started),
            tokens=_tokens(reply.usage),
        )
    return result


def failed_answer(question: Question, error: Exception, started: float) -> Answer:
    """What the asker receives when the model kept failing: an explicit abstention with the reason."""
    return Answer(
        question_id=question.question_id, tenant=question.tenant, answer="I could not answer: the model failed.",
        abstained=True, evidence=[], mode=choose_mode(question), latency_ms=_ms(started), tokens=_tokens(Usage()),
        error=f"{type(error).__name__}: {str(error)[:300]}",
    )


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)
