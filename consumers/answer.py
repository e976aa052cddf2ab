"""Answering a question: the mode is chosen here, run by its module in consumers/modes/, and its
result becomes the `Answer` message here, the only place one is built."""

from __future__ import annotations

import re
import time

from epistream.contracts.questions import Mode, Question
from epistream.contracts.replies import Answer, RoleTokens
from epistream.errors import ModelOutputError, ModelUnavailable
from epistream.models.llm import Usage

from .deps import AnswerDeps
from .modes.agentic import answer_agentic
from .modes.base import Abstention, ModeResult
from .modes.deep import answer_deep
from .modes.fast import answer_fast
from .progress import Steps

ROLES = ("master", "assistant", "extractor")

# Questions about when, how often, in which order: the structured tools answer those exactly.
_STRUCTURED = re.compile(
    r"\b(when|what (?:year|month|date|day)|how (?:many|often|long)|first|last|before|after|since|until|"
    r"count|times|ago)\b", re.IGNORECASE)

_MODES = {Mode.FAST: answer_fast, Mode.DEEP: answer_deep, Mode.AGENTIC: answer_agentic}


def choose_mode(question: Question) -> Mode:
    """`auto`: the structured tool loop for temporal and counting questions, assistants otherwise."""
    if question.mode is not Mode.AUTO:
        return question.mode
    return Mode.AGENTIC if _STRUCTURED.search(question.question) else Mode.DEEP


async def answer_question(question: Question, deps: AnswerDeps, steps: Steps | None = None) -> Answer:
    """Answer in the mode asked for (`auto` picks one); the answer says which ran. The mode reports its
    steps to `steps` (consumers/progress.py) as it takes them."""
    started = time.perf_counter()
    mode = choose_mode(question)
    steps = steps or Steps.none()
    steps.started(mode)
    result = await _MODES[mode](question, deps, steps)
    answer = build_answer(question, mode, result, started)
    deps.metrics.questions_answered.labels(mode.value, "abstained" if answer.abstained else "answered").inc()
    deps.metrics.answer_latency_seconds.labels(mode.value).observe(answer.latency_ms / 1000)
    return answer


def failed_answer(question: Question, error: BaseException, started: float) -> Answer:
    """What the asker receives when answering failed (the model kept failing, or anything else):
    an explicit abstention with the reason."""
    why = Abstention.MODEL_FAILED if isinstance(error, (ModelUnavailable, ModelOutputError)) else Abstention.FAILED
    return build_answer(question, choose_mode(question), ModeResult.abstain(why), started,
                        error=f"{type(error).__name__}: {str(error)[:300]}")


def build_answer(question: Question, mode: Mode, result: ModeResult, started: float, *,
                 error: str | None = None) -> Answer:
    return Answer(
        question_id=question.question_id, tenant=question.tenant, answer=result.answer,
        abstained=result.abstained, evidence=[] if result.abstained else result.evidence, mode=mode,
        latency_ms=round((time.perf_counter() - started) * 1000, 1),
        tokens=role_tokens(result.master, result.assistants), error=error,
    )


def role_tokens(master: Usage, assistant: Usage | None = None) -> dict[str, RoleTokens]:
    tokens = {role: RoleTokens() for role in ROLES}
    for role, usage in (("master", master), ("assistant", assistant or Usage())):
        tokens[role] = RoleTokens(prompt=usage.prompt_tokens, completion=usage.completion_tokens, calls=usage.calls)
    return tokens
