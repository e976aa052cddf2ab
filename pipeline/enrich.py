"""Enrichment: one structured model call per closed segment, then deterministic
repair of what the model returned (dates, speakers, ids) before it is stored.

`postprocess` is pure and is what the unit tests exercise; `enrich_segment`
adds the model call, the embeddings and the store, and decides what happens to
a segment that cannot be enriched now:

- the model is unavailable (refused, timed out, 5xx after the client's retries):
  the segment *waits* and the breaker pauses the calls; `retry_waiting` enriches
  the waiting segments from the store once a probe call finds the model back;
- a transient database error: the step is retried until it works;
- anything else (output that keeps failing validation, a request the model
  rejects, an error storing this segment): the segment *fails* with its reason
  and the caller dead-letters it. Never a segment left silently pending.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import partial
from typing import Any, TypeVar

from psycopg_pool import AsyncConnectionPool

from epistream.contracts.segments import Segment, SegmentTurn
from epistream.core.dates import RELATIVE_PATTERN, ResolvedDate, gist_sentence, leading_date, resolve
from epistream.core.metrics import Metrics
from epistream.core.names import normalize_name, normalize_predicate, resolve_speaker
from epistream.core.retry import BLOCKING, retry
from epistream.errors import ModelOutputError, ModelRejected, ModelUnavailable, is_transient
from epistream.models.embeddings import Embedder
from epistream.models.llm import ModelClient
from epistream.models.prompts import fence, turn_line
from epistream.settings.processes import Settings
from epistream.storage.db import tenant_scope

from .breaker import CircuitBreaker
from .enrichment import Enrichment, FactRow, GistRow
from .prompt_fit import Fitted, fit_turns, prompt_budget_chars
from .prompts import ENRICH_PROMPT, EnrichmentOut, FactOut, GistOut
from .store import memory, segments

log = logging.getLogger(__name__)

STAGE = "enrich"
_WORD = re.compile(r"\w+", re.UNICODE)
T = TypeVar("T")


def build_messages(segment: Segment) -> list[dict[str, str]]:
    user = fence("segment", "\n".join(turn_line(t) for t in segment.turns))
    return [{"role": "system", "content": ENRICH_PROMPT.template}, {"role": "user", "content": user}]


def fit_segment(segment: Segment, settings: Settings) -> Fitted:
    """The segment's turns cut to what the extractor's context holds beside the instructions and
    the completion budget (`model_ctx`, `extractor_max_tokens`)."""
    framing = ENRICH_PROMPT.template + fence("segment", "")
    budget = prompt_budget_chars(context_tokens=settings.model_ctx, completion_tokens=settings.extractor_max_tokens,
                                 fixed_text=framing)
    # Each line's own characters: its time, weekday, id and speaker (turn_line of an empty text), and a newline.
    overhead = max((len(turn_line(t.model_copy(update={"text": ""}))) + 1 for t in segment.turns), default=0)
    return fit_turns(segment.turns, budget, line_overhead=overhead)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if len(w) > 2}


def source_turns(ids: list[str], text: str, turns: list[SegmentTurn]) -> list[SegmentTurn]:
    """The turns a gist or fact cites; when it cites none that exist, the turn
    sharing most words with it (the model's ids are often wrong, its text less so)."""
    by_id = {t.turn_id: t for t in turns}
    cited = [by_id[i] for i in dict.fromkeys(ids) if i in by_id]
    if cited:
        return cited
    words = _words(text)
    return [max(turns, key=lambda t: (len(words & _words(t.text)), -turns.index(t)))]


def event_date(model_date: str | None, text: str, sources: list[SegmentTurn]) -> ResolvedDate:
    """When the event happened, checked against the source turns.

    A relative expression in the source turn ("three weeks ago"), resolved
    against that turn's time, beats a model date that disagrees with it; then
    the model's date; then a date the gist text starts with; then the day the
    turn was said."""
    anchor = sources[0].ts
    from_source = [
        r for t in sources for m in RELATIVE_PATTERN.finditer(t.text) if (r := resolve(m.group(0), t.ts)) is not None
    ]
    proposed = resolve(model_date, anchor)
    if from_source and (proposed is None or proposed.value not in {r.value for r in from_source}):
        return from_source[0]
    if proposed is not None:
        return proposed
    leading, _ = leading_date(text)
    if leading is not None:
        return ResolvedDate(leading, "day")
    return ResolvedDate(anchor.date(), "day")


def _qualifier(value: str | None, anchor: datetime) -> date | None:
    resolved = resolve(value, anchor)
    return None if resolved is None else resolved.value


def _gists(segment: Segment, raw: list[GistOut]) -> list[GistRow]:
    rows: list[GistRow] = []
    seen: set[str] = set()
    for gist in raw:
        sources = source_turns(gist.turn_ids, gist.text, segment.turns)
        when = event_date(gist.date, gist.text, sources)
        try:
            text = gist_sentence(gist.text, when, sources[0].ts)
        except ValueError:
            continue  # nothing but a date: not an event
        key = normalize_name(text)
        if not key or key in seen:
            continue
        seen.add(key)
        ordinal = len(rows)
        rows.append(GistRow(
            gist_id=f"{segment.segment_id}/g{ordinal:02d}", ordinal=ordinal, text=text, event_date=when.value,
            precision=when.precision, turn_ids=tuple(t.turn_id for t in sources), said_at=sources[0].ts,
        ))
    return rows


def _facts(segment: Segment, raw: list[FactOut]) -> list[FactRow]:
    rows: list[FactRow] = []
    seen: set[tuple] = set()
    for fact in raw:
        sources = source_turns(fact.turn_ids, f"{fact.subject} {fact.predicate} {fact.object}", segment.turns)
        anchor, speaker = sources[0].ts, sources[0].speaker
        subject = resolve_speaker(fact.subject, speaker)
        obj = resolve_speaker(fact.object, speaker)
        predicate = normalize_predicate(fact.predicate)
        if not (normalize_name(subject) and normalize_name(obj) and predicate):
            continue
        qualifiers = tuple(_qualifier(v, anchor) for v in (fact.point_in_time, fact.start_time, fact.end_time))
        key = (normalize_name(subject), predicate, normalize_name(obj), qualifiers)
        if key in seen:
            continue
        seen.add(key)
        ordinal = len(rows)
        rows.append(FactRow(
            fact_id=f"{segment.segment_id}/f{ordinal:02d}", ordinal=ordinal, subject=subject, predicate=predicate,
            object=obj, point_in_time=qualifiers[0], start_time=qualifiers[1], end_time=qualifiers[2],
            turn_ids=tuple(t.turn_id for t in sources), said_at=anchor,
        ))
    return rows


def _mentions(gists: list[GistRow], facts: list[FactRow], entities: dict[str, str]) -> dict[str, list[str]]:
    """A gist mentions an entity named in its text, or one of a fact drawn from the same turn."""
    mentions: dict[str, list[str]] = {}
    for gist in gists:
        padded = f" {normalize_name(gist.text)} "
        names = [n for n in entities if f" {n} " in padded]
        for fact in facts:
            if set(fact.turn_ids) & set(gist.turn_ids):
                names += [normalize_name(fact.subject), normalize_name(fact.object)]
        mentions[gist.gist_id] = sorted(dict.fromkeys(n for n in names if n in entities))
    return mentions


def postprocess(segment: Segment, out: EnrichmentOut) -> Enrichment:
    gists = _gists(segment, out.gists)
    facts = _facts(segment, out.facts)
    entities: dict[str, str] = {}
    for name in [t.speaker for t in segment.turns] + [n for f in facts for n in (f.subject, f.object)]:
        entities.setdefault(normalize_name(name), name.strip())
    entities.pop("", None)
    return Enrichment(
        summary=" ".join(out.summary.split()), gists=gists, facts=facts, entities=entities,
        mentions=_mentions(gists, facts, entities),
    )


@dataclass(frozen=True)
class EnrichDeps:
    settings: Settings
    pool: AsyncConnectionPool
    embedder: Embedder
    extractor: ModelClient
    metrics: Metrics
    #: One per worker process: shared by its enrich actors and its retry timer.
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)


@dataclass(frozen=True)
class EnrichOutcome:
    segment_id: str
    enriched: bool
    error: Exception | None = None
    counts: memory.StoreCounts | None = None
    #: enriched, done (already), forgotten, stale (a turn corrected since it was sent), waiting (for the model),
    #: failed (dead-letter `error`)
    status: str = "enriched"
    #: characters of turn text cut to fit the model's context
    truncated_chars: int = 0


async def _db(operation: Callable[[], Awaitable[T]], what: str) -> T:
    """A database step, retried while its error is transient (a restart, a lost deadlock): nothing was
    written, and the event stays unacknowledged meanwhile."""
    def waiting(exc: BaseException, attempt: int, delay: float) -> None:
        log.warning("%s: %s (attempt %d), retrying in %.1fs", what, type(exc).__name__, attempt, delay)

    return await retry(operation, backoff=BLOCKING, retry_on=is_transient, on_retry=waiting)


async def _with_conn(deps: EnrichDeps, step: Callable[[Any], Awaitable[T]]) -> T:
    async with deps.pool.connection() as conn:
        return await step(conn)


async def _fail(segment: Segment, deps: EnrichDeps, exc: Exception) -> EnrichOutcome:
    await _db(lambda: _with_conn(deps, lambda conn: memory.mark_failed(conn, segment, exc)), "marking failed")
    deps.metrics.segments_enriched.labels("failed").inc()
    log.warning("enrichment of %s failed: %s: %s", segment.segment_id, type(exc).__name__, str(exc)[:200])
    return EnrichOutcome(segment.segment_id, False, exc, status="failed")


async def _wait(segment: Segment, deps: EnrichDeps, exc: Exception, *, called: bool) -> EnrichOutcome:
    await _db(lambda: _with_conn(deps, lambda conn: memory.mark_waiting(conn, segment, exc, called=called)),
              "marking waiting")
    deps.metrics.segments_enriched.labels("waiting").inc()
    log.warning("enrichment of %s waits for the model: %s", segment.segment_id, str(exc)[:200])
    return EnrichOutcome(segment.segment_id, False, status="waiting")


async def _call_model(segment: Segment, deps: EnrichDeps, fitted: Fitted) -> Any:
    """The model's reply; or the outcome when it gave none usable (waiting, failed)."""
    breaker = deps.breaker
    if not breaker.acquire():  # paused: spare a model that was just found down
        return await _wait(segment, deps, ModelUnavailable("paused: the model was unavailable"), called=False)
    try:
        reply = await deps.extractor.complete_json(
            build_messages(segment.model_copy(update={"turns": fitted.turns})), ENRICH_PROMPT.schema,
            max_tokens=deps.settings.extractor_max_tokens,
        )
    except (ModelOutputError, ModelRejected) as exc:  # it answered: up, but this segment fails
        breaker.succeeded()
        return await _fail(segment, deps, exc)
    except ModelUnavailable as exc:
        breaker.failed()
        return await _wait(segment, deps, exc, called=True)
    except BaseException:
        breaker.abandoned()
        raise
    breaker.succeeded()
    return reply


async def enrich_segment(segment: Segment, deps: EnrichDeps) -> EnrichOutcome:
    """Enrich and store one segment (see the module's docstring for what happens when it cannot)."""
    started = time.perf_counter()
    skip = await _db(lambda: _with_conn(deps, lambda conn: memory.skip_reason(conn, segment, ENRICH_PROMPT.version)),
                     "checking the segment")
    if skip is not None:
        # Spare the model: a forgotten conversation, a redelivery of a segment already enriched, a stale message.
        deps.metrics.segments_enriched.labels(skip).inc()
        return EnrichOutcome(segment.segment_id, skip == "done", status=skip)
    fitted = fit_segment(segment, deps.settings)
    if fitted.truncated_chars:
        log.warning("segment %s cut to the model's context: %d characters of turns %s left out of the prompt",
                    segment.segment_id, fitted.truncated_chars, ", ".join(fitted.truncated_turns))
    reply = await _call_model(segment, deps, fitted)
    if isinstance(reply, EnrichOutcome):
        return reply
    try:
        enrichment = postprocess(segment, reply.value)
        texts = [enrichment.summary, *(g.text for g in enrichment.gists), *enrichment.entities.values()]
        vectors = await asyncio.to_thread(deps.embedder.embed, texts)
        counts = await _db(lambda: _with_conn(deps, lambda conn: memory.store_enrichment(
            conn, segment, enrichment, vectors, settings=deps.settings, prompt_version=ENRICH_PROMPT.version,
        )), "storing the enrichment")
    except Exception as exc:  # not transient (those were retried): this segment cannot be stored as it is
        return await _fail(segment, deps, exc)
    metrics = deps.metrics
    if isinstance(counts, str):  # forgotten, or stale: nothing was stored
        metrics.segments_enriched.labels(counts).inc()
        return EnrichOutcome(segment.segment_id, False, status=counts)
    metrics.segments_enriched.labels("enriched").inc()
    metrics.enrich_seconds.observe(time.perf_counter() - started)
    for kind, n in (("gist", counts.gists), ("fact", counts.facts), ("mention", counts.mentions)):
        metrics.memory_items.labels(kind).inc(n)
    if segment.produced_at is not None:
        metrics.produce_to_facts_seconds.observe(max(0.0, (datetime.now(UTC) - segment.produced_at).total_seconds()))
    return EnrichOutcome(segment.segment_id, True, counts=counts, truncated_chars=fitted.truncated_chars)


#: Told of a segment retried from the store that failed: the caller dead-letters it.
OnFailed = Callable[[Segment, EnrichOutcome], Awaitable[None]]


async def retry_waiting(deps: EnrichDeps, *, limit: int = 20, on_failed: OnFailed | None = None) -> list[EnrichOutcome]:
    """Enrich segments waiting for the model, oldest first, while the breaker lets calls through
    (the first call after a pause is its probe); stops as soon as the model is found down again."""
    if not deps.breaker.allows_call():
        return []
    waiting = await _db(lambda: _with_conn(deps, lambda conn: memory.waiting_segments(conn, limit)),
                        "listing waiting segments")
    outcomes: list[EnrichOutcome] = []
    for tenant, sid in waiting:
        if not deps.breaker.allows_call():
            break
        segment = await _db(partial(_with_conn, deps, partial(_load, tenant=tenant, sid=sid)),
                            "loading a waiting segment")
        if segment is None:
            continue  # forgotten since
        outcome = await enrich_segment(segment, deps)
        outcomes.append(outcome)
        if outcome.status == "failed" and on_failed is not None:
            await on_failed(segment, outcome)
    return outcomes


async def _load(conn: Any, tenant: str, sid: str) -> Segment | None:
    async with tenant_scope(conn, tenant):
        return await segments.load_segment(conn, tenant, sid)
