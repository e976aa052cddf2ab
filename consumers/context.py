"""The budgeted context builder, with no model call: the `context` read's reply, and what `fast`
mode puts before its master.

Candidates come from the fused turn search (dense + BM25, reciprocal-rank fused; the speakers the
question names taken out of its text and their turns given a bonus: consumers/best_turns.py) with
the turns beside its best hits, the gists nearest the question with the turns they were written
from, and the facts about the entities it names, all within one time window: the
asker's ``time_range`` met with the period the question names ("last week", "in May 2023",
resolved against when it was asked). Facts are the current ones, and superseded ones too when
the question asks about the past. consumers/packing.py ranks them in one list, deduplicates and
packs them into the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from typing import Protocol

from epistream.contracts import (
    CONTEXT_BUDGET_DEFAULT,
    MemoryContext,
    Question,
    ResolvedPeriod,
    TimeRange,
    check_budget,
)
from epistream.dates import relative_dates
from epistream.db import tenant_scope
from epistream.metrics import Metrics

from .best_turns import SearchDeps, best_turns
from .packing import (
    Candidate,
    fact_candidate,
    gist_candidate,
    neighbour_candidate,
    pack,
    period_of,
    rank,
    source_candidate,
    turn_candidate,
)
from .retrieval import Recipes, TurnRecipe, facts_named, nearest_gists, neighbour_turns, turns_at
from .timefilter import Period, asks_about_past, find_period, last_day

#: A turn's line is rarely under this many tokens (date, speaker, a few words): the budget over it
#: is how many turns the fused search is asked for, so a larger budget reads deeper.
TOKENS_PER_TURN_FLOOR = 10
MAX_TURN_CANDIDATES = 1_000
#: Gists and facts asked for: one per this many tokens of budget, within the bounds.
TOKENS_PER_STRUCTURED = 100
GIST_CANDIDATES = (5, 100)
FACT_CANDIDATES = (10, 100)


@dataclass(frozen=True)
class GistSources:
    """The source turns of the best ``gists`` gists, each ranked at ``share`` of its gist's score.
    Not measured on LoCoMo yet: the equal-budget eval's memory is not enriched
    (docs/benchmarks/budget-recall.md)."""

    gists: int = 5
    share: float = 0.9


GIST_SOURCES = GistSources()


@dataclass(frozen=True)
class Neighbours:
    """The turns beside the best ``seeds`` turn hits (``each_side`` before and after), each ranked at
    ``share`` of its seed's score. Chosen on the pick split (bench.budget_recall's context_* rows): at
    1,000 tokens none 0.716, 3 at 0.95 0.729, 5 at 0.9 0.729, 10 at 0.8 0.742."""

    seeds: int = 10
    each_side: int = 1
    share: float = 0.8


NEIGHBOURS = Neighbours()


class ContextDeps(SearchDeps, Protocol):
    """What the builder needs (AnswerDeps has it; the eval harness can build its own)."""

    @property
    def recipes(self) -> Recipes: ...


@dataclass(frozen=True)
class Window:
    """Instants [start, end), either open; ``empty`` when the asked range and the question's period do not meet."""

    start: datetime | None = None
    end: datetime | None = None

    @property
    def empty(self) -> bool:
        return self.start is not None and self.end is not None and self.start >= self.end

    @property
    def days(self) -> tuple[date | None, date | None]:
        """The window as UTC calendar days [first, last] (for gists' and facts' dates)."""
        return (None if self.start is None else self.start.astimezone(UTC).date(),
                None if self.end is None else last_day(self.end))


def window_of(time_range: TimeRange | None, period: Period | None) -> Window:
    """The asked range met with the question's own period."""
    ranges = [r for r in (time_range, None if period is None else period.range) if r is not None]
    starts = [r.start for r in ranges if r.start is not None]
    ends = [r.end for r in ranges if r.end is not None]
    return Window(max(starts, default=None), min(ends, default=None))


def question_periods(question: str, asked_at: datetime, period: Period | None) -> list[ResolvedPeriod]:
    """The question's date expressions resolved against when it was asked; the one that
    restricts the read (``period``) marked ``filters``."""
    found = [period_of(expression, resolved) for expression, resolved in relative_dates(question, asked_at)]
    periods = [p for p in found if p is not None]
    if period is not None:
        first, last = period.range.days
        restricting = ResolvedPeriod(expression=period.expression, start=first, end=last, precision=period.precision,
                                     filters=True)
        periods = [p for p in periods if p.expression.lower() != period.expression.lower()] + [restricting]
    return periods


def candidate_counts(budget_tokens: int, recipe: TurnRecipe) -> tuple[TurnRecipe, int, int]:
    """The turn recipe deep enough for the budget, and how many gists and facts to read."""
    turns = min(MAX_TURN_CANDIDATES, max(recipe.top_k, -(-budget_tokens // TOKENS_PER_TURN_FLOOR)))
    structured = budget_tokens // TOKENS_PER_STRUCTURED
    return (replace(recipe, top_k=turns, pool=max(recipe.pool, turns)),
            min(GIST_CANDIDATES[1], max(GIST_CANDIDATES[0], structured)),
            min(FACT_CANDIDATES[1], max(FACT_CANDIDATES[0], structured)))


async def _candidates(deps: ContextDeps, *, tenant: str, question: str, conversation_ids: list[str] | None,
                      window: Window, past: bool, budget_tokens: int, neighbours: Neighbours,
                      sources: GistSources) -> list[Candidate]:
    recipe, gists, facts = candidate_counts(budget_tokens, deps.recipes.turns)
    first_day, last_day = window.days
    async with deps.pool.connection() as conn, tenant_scope(conn, tenant):
        found = await best_turns(conn, deps.embedder, tenant=tenant, question=question,
                                 conversation_ids=conversation_ids, recipe=recipe, start=window.start, end=window.end)
        turns, vector = found.turns, found.vector
        seeds = [turn_candidate(t) for t in turns]
        beside = await neighbour_turns(conn, tenant=tenant, seeds=turns[: neighbours.seeds],
                                       each_side=neighbours.each_side, start=window.start, end=window.end)
        gist_rows = await nearest_gists(conn, tenant=tenant, vector=vector, conversation_ids=conversation_ids,
                                        limit=gists, first_day=first_day, last_day=last_day)
        fact_rows = await facts_named(conn, tenant=tenant, question=question, conversation_ids=conversation_ids,
                                      limit=facts, with_superseded=past, first_day=first_day, last_day=last_day)
        gists_found = [gist_candidate(row, n, recipe.rrf_k) for n, row in enumerate(gist_rows, start=1)]
        wanted = [(row["conversation_id"], turn_id, n) for n, row in enumerate(gist_rows[: sources.gists], start=1)
                  for turn_id in row["turn_ids"]]
        sourced = await turns_at(conn, tenant=tenant, wanted=wanted, start=window.start, end=window.end)
    return (seeds
            + [neighbour_candidate(n.turn, seeds[n.seed - 1], n.seed, neighbours.share) for n in beside]
            + gists_found
            + [source_candidate(s.turn, gists_found[s.seed - 1], s.seed, sources.share) for s in sourced]
            + [fact_candidate(row, n, recipe.rrf_k) for n, row in enumerate(fact_rows, start=1)])


async def build_context(
    deps: ContextDeps, *, tenant: str, question: str, asked_at: datetime | None,
    budget_tokens: int = CONTEXT_BUDGET_DEFAULT, time_range: TimeRange | None = None,
    conversation_ids: list[str] | None = None, question_id: str = "in-process",
    neighbours: Neighbours = NEIGHBOURS, sources: GistSources = GIST_SOURCES,
) -> MemoryContext:
    """The best memory for ``question`` within ``budget_tokens`` (estimate_tokens of the text block),
    ranked best first, as a MemoryContext; no model call (the question is embedded here, without
    the names of the speakers it names)."""
    started = time.perf_counter()
    check_budget(budget_tokens)
    anchor = asked_at or datetime.now(UTC)
    period = find_period(question, anchor)
    window = window_of(time_range, period)
    past = asks_about_past(question, window.end, anchor)
    candidates: list[Candidate] = []
    if not window.empty:
        candidates = await _candidates(deps, tenant=tenant, question=question,
                                       conversation_ids=conversation_ids, window=window, past=past,
                                       budget_tokens=budget_tokens, neighbours=neighbours, sources=sources)
    packed = pack(rank(candidates), budget_tokens)
    return MemoryContext(
        question_id=question_id, tenant=tenant, asked_at=anchor, items=packed.items, text=packed.text,
        budget_tokens=budget_tokens, used_tokens=packed.used_tokens, time_range=time_range,
        resolved=question_periods(question, anchor, period), past=past,
        latency_ms=round((time.perf_counter() - started) * 1000, 2),
    )


async def context_for(question: Question, deps: ContextDeps, *, budget_tokens: int) -> MemoryContext:
    """The context a question reads (context and fast modes), its own budget before ``budget_tokens``."""
    return await build_context(
        deps, tenant=question.tenant, question=question.question, asked_at=question.asked_at,
        budget_tokens=question.budget_tokens or budget_tokens, time_range=question.time_range,
        conversation_ids=question.conversation_ids, question_id=question.question_id,
    )


class MetricDeps(ContextDeps, Protocol):
    @property
    def metrics(self) -> Metrics: ...


async def read_context(question: Question, deps: MetricDeps) -> MemoryContext:
    """A `context` question's reply, counted and timed (its latency also in the reply)."""
    context = await context_for(question, deps, budget_tokens=CONTEXT_BUDGET_DEFAULT)
    deps.metrics.questions_answered.labels("context", "answered" if context.items else "empty").inc()
    deps.metrics.context_read_seconds.observe(context.latency_ms / 1000)
    return context


def failed_context(question: Question, error: BaseException, started: float) -> MemoryContext:
    """What the asker of a `context` read receives when it failed: no items, and the reason."""
    return MemoryContext(
        question_id=question.question_id, tenant=question.tenant, asked_at=question.asked_at or datetime.now(UTC),
        items=[], text="", budget_tokens=question.budget_tokens or CONTEXT_BUDGET_DEFAULT, used_tokens=0,
        time_range=question.time_range, latency_ms=round((time.perf_counter() - started) * 1000, 2),
        error=f"{type(error).__name__}: {str(error)[:300]}",
    )
