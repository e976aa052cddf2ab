"""`deep` answering (E-mem): find what to read, let assistants quote evidence from each piece in
parallel, let the master aggregate the quotes into an answer.

What the assistants read is the recipe's choice (WindowRecipe.reads): windows around the best fused
turns (consumers/windows.py, the default: they hold more of the evidence at the same budget), or
E-mem's whole segments as the router ranks them."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np

from epistream.contracts.questions import Question
from epistream.contracts.replies import Evidence, ProgressStep
from epistream.core import tracing
from epistream.models.llm import Usage
from epistream.models.prompts import fence
from epistream.storage.db import tenant_scope

from ..assistants import QuotedTurn, SegmentText, load_segments
from ..best_turns import best_turns, best_turns_within
from ..deps import AnswerDeps
from ..progress import Steps
from ..prompts import MASTER_PROMPT
from ..retrieval import RetrievedTurn
from ..router import RoutedSegment, route
from ..timefilter import DateRange, QuestionTime
from ..windows import reading_windows
from .base import Abstention, ModeResult, model_text

# Events are often told after they happen ("last month I..."): what was said shortly after a period the
# question names is about it too.
TOLD_LATER = timedelta(days=31)


def window_for(question: Question | QuestionTime) -> DateRange | None:
    """When the turns about the question's period were said (None: it names none): they are read first."""
    return (question if isinstance(question, QuestionTime) else QuestionTime.of(question)).said_about(TOLD_LATER)


def period_first(in_period: list[RetrievedTurn], anywhere: list[RetrievedTurn]) -> list[RetrievedTurn]:
    """The turns found within the period, then the others found in the whole memory, each once."""
    seen = {(t.conversation_id, t.turn_id) for t in in_period}
    return in_period + [t for t in anywhere if (t.conversation_id, t.turn_id) not in seen]


@tracing.traced("retrieve windows")
async def read_windows(deps: AnswerDeps, question: Question, when: QuestionTime | None = None) -> list[SegmentText]:
    """The reading windows around the question's best turns: those said about its period first (they are
    found within it), then the best of the whole memory."""
    recipe = deps.recipes.windows
    turns_recipe = replace(deps.recipes.turns, top_k=recipe.seeds, pool=max(deps.recipes.turns.pool, recipe.seeds))
    window = window_for(when or QuestionTime.of(question))
    async with deps.read_pool.connection() as conn, tenant_scope(conn, question.tenant):
        found = await best_turns(conn, deps.embedder, tenant=question.tenant, question=question.question,
                                 conversation_ids=question.conversation_ids, recipe=turns_recipe)
        seeds = found.turns
        if window is not None:
            in_period = await best_turns_within(conn, found, tenant=question.tenant,
                                                conversation_ids=question.conversation_ids, recipe=turns_recipe,
                                                start=window.start, end=window.end)
            seeds = period_first(in_period, seeds)
        windows = await reading_windows(conn, tenant=question.tenant, seeds=seeds, recipe=recipe)
    deps.metrics.router_candidates.observe(len(windows))
    return [w.text() for w in windows]


async def route_question(deps: AnswerDeps, question: Question, vector: np.ndarray,
                         when: QuestionTime | None = None) -> list[RoutedSegment]:
    """The router's segments: those it finds within the question's period first, then the others it finds
    in the whole memory, as many as its recipe reads."""
    window = window_for(when or QuestionTime.of(question))
    async with deps.read_pool.connection() as conn, tenant_scope(conn, question.tenant):
        routed = await route(conn, tenant=question.tenant, question=question.question, vector=vector,
                             conversation_ids=question.conversation_ids, recipe=deps.recipes.router)
        if window is not None:
            in_period = await route(conn, tenant=question.tenant, question=question.question, vector=vector,
                                    conversation_ids=question.conversation_ids, recipe=deps.recipes.router,
                                    window=window)
            chosen = {s.segment_id for s in in_period}
            routed = (in_period + [s for s in routed if s.segment_id not in chosen])[: max(len(routed),
                                                                                          len(in_period))]
    deps.metrics.router_candidates.observe(len(routed))
    return routed


def evidence_lines(quotes: list[QuotedTurn]) -> str:
    return "\n".join(
        f"[{n}] {q.time:%Y-%m-%d %H:%M (%A)} {q.speaker}: {q.quote}" for n, q in enumerate(quotes, start=1)
    )


def master_messages(question: Question, quotes: list[QuotedTurn]) -> list[dict[str, str]]:
    asked = (question.asked_at or datetime.now(UTC)).strftime("%Y-%m-%d")
    user = f"{fence('evidence', evidence_lines(quotes))}\n\nToday is {asked}. Question: {question.question}"
    return [{"role": "system", "content": MASTER_PROMPT.template}, {"role": "user", "content": user}]


def to_evidence(quotes: list[QuotedTurn]) -> list[Evidence]:
    return [
        Evidence(conversation_id=q.conversation_id, segment_id=q.segment_id, turn_ids=[q.turn_id], quote=q.quote,
                 time=q.time, speaker=q.speaker)
        for q in quotes
    ]


@tracing.traced("route segments")
async def routed_segments(deps: AnswerDeps, question: Question, when: QuestionTime) -> list[SegmentText]:
    """E-mem's reading: the router's segments, whole."""
    vector = await asyncio.to_thread(deps.embedder.embed_query, question.question)
    routed = await route_question(deps, question, vector, when)
    async with deps.read_pool.connection() as conn, tenant_scope(conn, question.tenant):
        return await load_segments(conn, question.tenant, routed)


async def answer_deep(question: Question, deps: AnswerDeps, steps: Steps | None = None) -> ModeResult:
    when = QuestionTime.of(question)
    steps = steps or Steps.none()
    if deps.recipes.windows.reads == "windows":
        segments = await read_windows(deps, question, when)
    else:
        segments = await routed_segments(deps, question, when)
    steps.report(ProgressStep.RETRIEVED, total=len(segments))
    read = 0

    def one_read() -> None:  # as each read ends, in whatever order they end
        nonlocal read
        read += 1
        steps.report(ProgressStep.ASSISTANT_READ, done=read, total=len(segments))

    readings = await deps.assistants.read_all(segments, question.question, on_read=one_read)
    assistant_usage = sum((r.usage for r in readings), Usage())
    # In time order, so "the most recent" is also the last line the master reads.
    quotes = sorted((q for r in readings for q in r.quotes), key=lambda q: (q.time, q.turn_id))
    if not quotes:
        return ModeResult.abstain(Abstention.NO_EVIDENCE, assistants=assistant_usage)
    steps.report(ProgressStep.MASTER_CALL)
    reply = await deps.master.complete_json(master_messages(question, quotes), MASTER_PROMPT.schema,
                                            max_tokens=deps.settings.llm_max_tokens)
    cited = [quotes[n - 1] for n in dict.fromkeys(reply.value.evidence) if 1 <= n <= len(quotes)] or quotes
    return ModeResult(
        answer=model_text(reply.value.answer), abstained=reply.value.abstain,
        evidence=[] if reply.value.abstain else to_evidence(cited), master=reply.usage,
        assistants=assistant_usage,
    )
