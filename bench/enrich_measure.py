"""What one enrichment run left in PostgreSQL: per-conversation counts, per-segment and per-turn timings,
failures, and whether other tenants used the same worker meanwhile; and the model's own limit, measured
in the same run (one enrichment request sent straight to the model server)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import openai
import psycopg
from psycopg.rows import dict_row
from pydantic import ValidationError

from epistream.contracts import Segment
from epistream.llm import response_format
from epistream.pipeline.enrich import build_messages
from epistream.pipeline.prompts import EnrichmentOut
from epistream.pipeline.store.segments import load_segment
from epistream.settings import Settings

PER_CONVERSATION = """
SELECT t.conversation_id,
       (SELECT count(*) FROM memory.turns x WHERE x.tenant = t.tenant AND x.conversation_id = t.conversation_id) AS turns,
       count(s.*) AS segments,
       count(s.*) FILTER (WHERE s.status = 'enriched') AS enriched,
       count(s.*) FILTER (WHERE s.status = 'failed') AS failed,
       count(s.*) FILTER (WHERE s.status = 'pending') AS pending,
       coalesce(sum(s.attempts), 0) AS attempts,
       (SELECT count(*) FROM memory.gists g WHERE g.tenant = t.tenant AND g.conversation_id = t.conversation_id) AS gists,
       (SELECT count(*) FROM memory.facts f WHERE f.tenant = t.tenant AND f.conversation_id = t.conversation_id) AS facts
FROM (SELECT DISTINCT tenant, conversation_id FROM memory.turns WHERE tenant = %(t)s) t
LEFT JOIN memory.segments s ON s.tenant = t.tenant AND s.conversation_id = t.conversation_id
GROUP BY t.tenant, t.conversation_id ORDER BY t.conversation_id
"""
SEGMENTS = """
SELECT segment_id, conversation_id, close_reason, token_estimate, cardinality(turn_ids) AS turns, status, attempts,
       error, produced_at, closed_at, published_at, enriched_at,
       (SELECT count(*) FROM memory.gists g WHERE g.tenant = s.tenant AND g.segment_id = s.segment_id) AS gists,
       (SELECT count(*) FROM memory.facts f WHERE f.tenant = s.tenant AND f.segment_id = s.segment_id) AS facts
FROM memory.segments s WHERE tenant = %(t)s ORDER BY closed_at
"""
TURN_LATENCIES = """
SELECT extract(epoch FROM stored_at - produced_at)::float8 FROM memory.turns
WHERE tenant = %(t)s AND produced_at IS NOT NULL
"""
ENTITIES = "SELECT count(*) FROM memory.entities WHERE tenant = %(t)s"
# Another tenant's segments closed or enriched in the window went through the same enrich agent and model.
NEIGHBOURS = """
SELECT tenant, count(*) FILTER (WHERE closed_at BETWEEN %(a)s AND %(b)s) AS closed,
       count(*) FILTER (WHERE enriched_at BETWEEN %(a)s AND %(b)s) AS enriched
FROM memory.segments WHERE tenant <> %(t)s
  AND (closed_at BETWEEN %(a)s AND %(b)s OR enriched_at BETWEEN %(a)s AND %(b)s)
GROUP BY tenant
"""


@dataclass(frozen=True)
class RunRows:
    conversations: list[dict[str, Any]]
    segments: list[dict[str, Any]]
    turn_latencies_s: np.ndarray
    entities: int
    neighbours: dict[str, dict[str, int]]


def read_run(url: str, tenant: str, window: tuple[datetime, datetime]) -> RunRows:
    params = {"t": tenant, "a": window[0], "b": window[1]}
    with psycopg.connect(url) as conn:
        cur = conn.cursor(row_factory=dict_row)
        conversations = cur.execute(PER_CONVERSATION, params).fetchall()
        segments = cur.execute(SEGMENTS, params).fetchall()
        latencies = np.array([r[0] for r in conn.execute(TURN_LATENCIES, params).fetchall()], dtype=np.float64)
        entities = int(conn.execute(ENTITIES, params).fetchone()[0])  # type: ignore[index]
        neighbours = {
            r[0]: {"closed": int(r[1]), "enriched": int(r[2])} for r in conn.execute(NEIGHBOURS, params).fetchall()
        }
    return RunRows(conversations, segments, latencies, entities, neighbours)


def percentiles(values: np.ndarray | list[float]) -> dict[str, float | None]:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    p50, p95 = np.percentile(a, [50, 95])
    return {"n": int(a.size), "p50": round(float(p50), 2), "p95": round(float(p95), 2), "max": round(float(a.max()), 2)}


def segment_timings(rows: RunRows, seen_done_at: dict[str, float]) -> dict[str, Any]:
    """Where a segment's time went, from its own timestamps:

    produced_at (newest turn's Kafka time) -> closed_at (the segmenter closed it: at once for a session
    change, after the idle timeout for a conversation's last segment) -> enriched_at (the store
    transaction began: queue + model call(s) + embedding done) -> seen by the bench (committed, +- 1 poll).
    """
    enriched = [s for s in rows.segments if s["status"] == "enriched" and s["produced_at"] is not None]

    def secs(items: list[dict[str, Any]], a: str, b: str) -> list[float]:
        return [(s[b] - s[a]).total_seconds() for s in items if s[a] is not None and s[b] is not None]

    seen = [
        seen_done_at[s["segment_id"]] - s["produced_at"].timestamp()
        for s in enriched if s["segment_id"] in seen_done_at
    ]
    by_reason: dict[str, Any] = {}
    for reason in sorted({s["close_reason"] for s in enriched}):
        group = [s for s in enriched if s["close_reason"] == reason]
        by_reason[reason] = percentiles(secs(group, "produced_at", "enriched_at"))
    return {
        "produce_to_facts_s": percentiles(secs(enriched, "produced_at", "enriched_at")),
        "produce_to_facts_seen_s": percentiles(seen),
        "produce_to_close_s": percentiles(secs(enriched, "produced_at", "closed_at")),
        "close_to_facts_s": percentiles(secs(enriched, "closed_at", "enriched_at")),
        "produce_to_facts_by_close_reason_s": by_reason,
    }


def failures(rows: RunRows) -> dict[str, Any]:
    """Failed segments by error class, with one message each (the error column is '<class>: <message>')."""
    found: dict[str, dict[str, Any]] = {}
    for s in rows.segments:
        if s["status"] != "failed":
            continue
        cls, _, message = (s["error"] or "unknown").partition(": ")
        entry = found.setdefault(cls, {"segments": 0, "example": message[:300]})
        entry["segments"] += 1
    return found


# --- the model's own limit ----------------------------------------------------------------------
#
# One enrichment request, exactly as the worker builds it, sent straight to the
# model server twice.
#
# The first call is what a new segment costs the model back to back (the
# system prompt's prefix is already evaluated, as it is between the worker's
# calls); the second, identical one finds its whole prompt evaluated
# (llama.cpp keeps the last prompt's tokens), so it is the generation alone.
# Together they give the model's prompt and generation speeds.

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
