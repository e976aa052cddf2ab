"""The model's own limit: one enrichment request, exactly as the worker builds it, sent straight to the
model server twice.

The first call is what a new segment costs the model back to back (the
system prompt's prefix is already evaluated, as it is between the worker's
calls); the second, identical one finds its whole prompt evaluated
(llama.cpp keeps the last prompt's tokens), so it is the generation alone.
Together they give the model's prompt and generation speeds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import openai
import psycopg
from pydantic import ValidationError

from epistream.contracts import Segment
from epistream.llm import response_format
from epistream.pipeline.enrich import build_messages
from epistream.pipeline.prompts import EnrichmentOut
from epistream.pipeline.store.segments import load_segment
from epistream.settings import Settings

# Far above the worker's own timeout: the baseline must finish to be a baseline.
DIRECT_TIMEOUT_S = 1800.0


def typical_segment_id(segments: list[dict[str, Any]]) -> str | None:
    """The segment of median size: the model's cost grows with the prompt."""
    if not segments:
        return None
    ordered = sorted(segments, key=lambda s: (s["token_estimate"], s["segment_id"]))
    return str(ordered[len(ordered) // 2]["segment_id"])


def load(url: str, tenant: str, segment_id: str) -> Segment | None:
    """The segment as the worker published it (turns in their speakers' local time)."""

    async def run() -> Segment | None:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            return await load_segment(conn, tenant, segment_id)

    return asyncio.run(run())


@dataclass(frozen=True)
class DirectCall:
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    valid: bool  # parses and validates as EnrichmentOut, as the worker requires
    error: str | None = None
    # Workers' model calls (any role) that finished meanwhile: the server runs one request at a time,
    # so any of them means this call waited for another's turn and its time is not the model's alone.
    other_calls_meanwhile: int | None = None


def call_once(settings: Settings, segment: Segment) -> DirectCall:
    # The worker's request, sent by a plain client: no retries, and a timeout the call cannot hit.
    client = openai.OpenAI(
        base_url=settings.extractor_url, api_key=settings.llm_api_key.get_secret_value(),
        timeout=DIRECT_TIMEOUT_S, max_retries=0,
    )
    started = time.perf_counter()
    try:
        with client:
            response = client.chat.completions.create(
                model=settings.extractor_model_name,
                messages=build_messages(segment),  # type: ignore[arg-type]
                max_tokens=settings.extractor_max_tokens,
                temperature=0.0,  # what ModelClient.complete_json sends
                response_format=response_format(EnrichmentOut, settings.llm_json_mode),  # type: ignore[arg-type]
            )
    except openai.OpenAIError as exc:
        return DirectCall(time.perf_counter() - started, 0, 0, None, False, f"{type(exc).__name__}: {exc}"[:300])
    seconds = time.perf_counter() - started
    choice = response.choices[0] if response.choices else None
    content = (choice.message.content or "") if choice else ""
    try:
        EnrichmentOut.model_validate(json.loads(content, strict=False))
        valid = True
    except (json.JSONDecodeError, ValidationError):
        valid = False
    usage = response.usage
    return DirectCall(
        seconds, usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0,
        choice.finish_reason if choice else None, valid,
    )


@dataclass(frozen=True)
class DirectBaseline:
    segment_id: str
    turns: int
    token_estimate: int
    first: DirectCall  # a new prompt: what each segment costs back to back
    repeat: DirectCall  # the same prompt again: generation only

    @property
    def segments_per_min(self) -> float:
        return 60.0 / self.first.seconds

    @property
    def generation_s_per_token(self) -> float | None:
        return self.repeat.seconds / self.repeat.completion_tokens if self.repeat.completion_tokens else None

    @property
    def prompt_s_per_token(self) -> float | None:
        if not self.first.prompt_tokens:
            return None
        return max(0.0, self.first.seconds - self.repeat.seconds) / self.first.prompt_tokens

    def model_bound_seconds(self, prompt_tokens: float, completion_tokens: float) -> float | None:
        """How long the model alone would take for these tokens at this run's measured speeds."""
        g, p = self.generation_s_per_token, self.prompt_s_per_token
        return None if g is None or p is None else prompt_tokens * p + completion_tokens * g

    def to_dict(self) -> dict[str, Any]:
        return {
            "segment_id": self.segment_id,
            "turns": self.turns,
            "token_estimate": self.token_estimate,
            "first_call": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self.first).items()},
            "repeat_call": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self.repeat).items()},
            "segments_per_min": round(self.segments_per_min, 3),
            "prompt_tokens_per_s": round(1 / self.prompt_s_per_token, 1) if self.prompt_s_per_token else None,
            "generation_tokens_per_s": round(1 / self.generation_s_per_token, 2) if self.generation_s_per_token else None,
        }


def measure_direct(
    settings: Settings, segment: Segment, token_estimate: int, calls_so_far: Callable[[], float | None]
) -> DirectBaseline:
    """`calls_so_far`: the workers' model call count (None when unreadable)."""

    def timed() -> DirectCall:
        before = calls_so_far()
        call = call_once(settings, segment)
        after = calls_so_far()
        return replace(call, other_calls_meanwhile=int(after - before) if before is not None and after is not None else None)

    first = timed()
    repeat = timed()
    return DirectBaseline(segment.segment_id, len(segment.turns), token_estimate, first, repeat)
