"""The evaluation's two baselines, in process, on the same master endpoint as the workers:

  full context   the whole conversation (dated lines, newest kept when it does not
                 fit the model's window) in one master call;
  dense top-k    the k nearest turns by embedding in one master call.

Both use fast mode's system prompt (`answer_v1`) and its user-message layout
(numbered dated excerpts in <memory>, "Today is ...", the question) and its
`MasterAnswer` schema, so the only difference from epistream is what is read.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import datetime

from epistream.consumers.prompts import ANSWER_PROMPT_VERSION, MasterAnswer, load_prompt
from epistream.errors import EpistreamError, ModelUnavailable
from epistream.models.llm import ModelClient, Usage

log = logging.getLogger(__name__)

# Room the system prompt, the question and the chat template take, in tokens.
PROMPT_OVERHEAD_TOKENS = 320


@dataclass(frozen=True)
class Line:
    """One turn as the model reads it."""

    turn_id: str
    speaker: str
    text: str
    ts: datetime


def excerpt(number: int, line: Line) -> str:
    return f"[{number}] {line.ts:%Y-%m-%d %H:%M (%A)} {line.speaker}: {line.text}"


def messages(question: str, asked_at: datetime, lines: list[Line]) -> list[dict[str, str]]:
    body = "\n".join(excerpt(n, line) for n, line in enumerate(lines, start=1))
    user = f"<memory>\n{body}\n</memory>\n\nToday is {asked_at:%Y-%m-%d}. Question: {question}"
    return [{"role": "system", "content": load_prompt(ANSWER_PROMPT_VERSION)}, {"role": "user", "content": user}]


def context_budget_chars(model_ctx: int, answer_tokens: int, chars_per_token: float = 4.0) -> int:
    """Characters of excerpts that fit the window, leaving room for the answer and the prompt."""
    return max(0, int((model_ctx - answer_tokens - PROMPT_OVERHEAD_TOKENS) * chars_per_token))


def newest_that_fit(lines: list[Line], max_chars: int) -> list[Line]:
    """The most recent lines whose excerpts (with their numbers) fit `max_chars`, in time order."""
    ordered = sorted(lines, key=lambda line: (line.ts, line.turn_id))
    kept: list[Line] = []
    used = 0
    width = len(str(len(ordered)))  # numbers are assigned after the cut: count their widest form
    for line in reversed(ordered):
        size = len(excerpt(10**width - 1, line)) + 1  # +1: the newline
        if used + size > max_chars:
            break
        kept.append(line)
        used += size
    return list(reversed(kept))


@dataclass(frozen=True)
class BaselineAnswer:
    answer: str
    abstained: bool
    cited_turn_ids: list[str]
    context_turn_ids: list[str]
    usage: Usage
    latency_s: float
    error: str | None = None
    context_chars: int = 0


_OVERFLOW = re.compile(r"maximum context length is (\d+) tokens.*?\((\d+) in the messages", re.DOTALL)


def _is_context_overflow(exc: EpistreamError) -> bool:
    text = str(exc).lower()
    return isinstance(exc, ModelUnavailable) and ("badrequest" in text or "context" in text or "exceed" in text)


def shrunk_count(count: int, error: str, max_tokens: int) -> int:
    """How many of `count` lines to keep after the server said the prompt was too long:
    in proportion to the tokens it reported when it did (OpenAI/llama.cpp wording), else 3/4."""
    found = _OVERFLOW.search(error)
    if found:
        window, used = int(found.group(1)), int(found.group(2))
        share = (window - max_tokens - 64) / used if used else 0.75
        keep = int(count * min(share, 0.95) * 0.97)
    else:
        keep = count * 3 // 4
    return max(1, min(keep, count - 1))


async def answer_with(
    master: ModelClient, question: str, asked_at: datetime, lines: list[Line], *, max_tokens: int,
    shrink_on_overflow: bool = False,
) -> BaselineAnswer:
    """One master call over `lines`. With `shrink_on_overflow`, a request the server
    rejects as too long (the 4-chars-a-token estimate was too low) is retried with the
    oldest lines dropped, up to three times; `context_turn_ids` says what was read."""
    started = time.perf_counter()
    current = list(lines)
    for attempt in range(4):
        prompt = messages(question, asked_at, current)
        try:
            reply = await master.complete_json(prompt, MasterAnswer, max_tokens=max_tokens)
        except EpistreamError as exc:
            if shrink_on_overflow and attempt < 3 and len(current) > 1 and _is_context_overflow(exc):
                keep = shrunk_count(len(current), str(exc), max_tokens)
                log.warning("full context rejected (%s); retrying with the newest %d of %d turns",
                            type(exc).__name__, keep, len(current))
                current = current[len(current) - keep:]
                continue
            return BaselineAnswer("I could not answer: the model failed.", True, [], [c.turn_id for c in current],
                                  Usage(), time.perf_counter() - started, f"{type(exc).__name__}: {str(exc)[:300]}",
                                  sum(len(m["content"]) for m in prompt))
        value = reply.value
        cited = [current[n - 1].turn_id for n in dict.fromkeys(value.evidence) if 1 <= n <= len(current)]
        return BaselineAnswer(
            answer=value.answer.strip() or "I don't know", abstained=value.abstain, cited_turn_ids=cited,
            context_turn_ids=[c.turn_id for c in current], usage=reply.usage,
            latency_s=time.perf_counter() - started, context_chars=sum(len(m["content"]) for m in prompt),
        )
    raise AssertionError("unreachable")
