"""`fast` answering: the budgeted context (consumers/context.py, the same builder as the `context`
read) in one master call, with the items it cites as evidence."""

from __future__ import annotations

from datetime import UTC, datetime

from epistream.contracts.questions import Question
from epistream.contracts.replies import Evidence, MemoryContext, MemoryItem, ProgressStep
from epistream.models.prompts import fence

from ..context import build_context
from ..deps import AnswerDeps
from ..progress import Steps
from ..prompts import ANSWER_PROMPT
from .base import Abstention, ModeResult, model_text


def build_messages(question: Question, context: MemoryContext) -> list[dict[str, str]]:
    """The master's prompt: the context's numbered, dated lines (already within the budget)."""
    asked = (question.asked_at or datetime.now(UTC)).strftime("%Y-%m-%d")
    user = f"{fence('memory', context.text)}\n\nToday is {asked}. Question: {question.question}"
    return [{"role": "system", "content": ANSWER_PROMPT.template}, {"role": "user", "content": user}]


def item_evidence(item: MemoryItem) -> Evidence:
    return Evidence(conversation_id=item.conversation_id, segment_id=item.segment_id, turn_ids=list(item.turn_ids),
                    quote=item.text, time=item.time, speaker=item.speaker)


def evidence_from(items: list[MemoryItem], chosen: list[int], fallback: int = 3) -> list[Evidence]:
    """The items the model cited (only numbers that exist); else the best-ranked ones."""
    picked = [items[n - 1] for n in dict.fromkeys(chosen) if 1 <= n <= len(items)]
    return [item_evidence(item) for item in (picked or items[:fallback])]


async def answer_fast(question: Question, deps: AnswerDeps, steps: Steps | None = None) -> ModeResult:
    """One step: the budgeted context of gists, facts and turns, in one master call."""
    settings = deps.settings
    steps = steps or Steps.none()
    context = await build_context(question, deps, deps.recipes.context, budget_tokens=settings.fast_context_tokens)
    steps.report(ProgressStep.RETRIEVED, total=len(context.items))
    if not context.items:
        return ModeResult.abstain(Abstention.NO_MEMORY)
    steps.report(ProgressStep.MASTER_CALL)
    reply = await deps.master.complete_json(build_messages(question, context), ANSWER_PROMPT.schema,
                                            max_tokens=settings.llm_max_tokens)
    return ModeResult(
        answer=model_text(reply.value.answer),
        abstained=reply.value.abstain,
        evidence=[] if reply.value.abstain else evidence_from(context.items, reply.value.evidence),
        master=reply.usage,
    )
