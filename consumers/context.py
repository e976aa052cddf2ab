"""The budgeted context builder, with no model call: the `context` read's reply, and what `fast`
mode puts before its master.

Candidates come from the fused turn search (dense + BM25, reciprocal-rank fused; the speakers the
question names taken out of its text and their turns given a bonus: consumers/best_turns.py) with
the turns beside its best hits, the gists nearest the question with the turns they were written
from, and the facts about the entities it names, all within the asker's ``time_range`` (a hard
filter). Facts are the current ones, and superseded ones too when the question asks about the past.

The period the question names ("last week", "in May 2023", resolved against when it was asked:
consumers/timefilter.py, understood once) filters nothing: the same searches run once more within
it, and everything about it ranks first (the recipe's ``period_boost``): turns said in it or whose relative dates
fall in it, gists whose event falls in it, facts that held then, the turns beside them or a gist
was written from; for a question about a state ("where did Alice live in February 2024?")
everything said before the period's end. consumers/packing.py ranks them in one list,
deduplicates and packs them into the budget; between the two, the learned ranker (consumers/ranking.py,
EPISTREAM_CONTEXT_RANKER) reorders them by what it reads of each, and the coverage step (consumers/coverage.py,
off by default: it did not help on the report split) can re-pick the head that may fit so it spans the
question's aspects and sessions. How much of each it reads, and how it
weighs them, is one frozen ContextRecipe (consumers/retrieval/recipes.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from functools import cached_property
from typing import Any, Protocol

from psycopg import AsyncConnection

from epistream.contracts.questions import CONTEXT_BUDGET_DEFAULT, Question, check_budget
from epistream.contracts.replies import MemoryContext
from epistream.core.dates import RELATIVE_PATTERN
from epistream.core.metrics import Metrics
from epistream.storage.db import tenant_scope

from .best_turns import FoundTurns, SearchDeps, best_turns, best_turns_within
from .coverage import NO_COVERAGE, cover
from .packing import (
    Candidate,
    fact_candidate,
    gist_candidate,
    neighbour_candidate,
    pack,
    rank,
    source_candidate,
    turn_candidate,
    with_dates,
)
from .ranking import Asked, reorder
from .retrieval import (
    PERIOD_BOOST,
    ContextRecipe,
    Coverage,
    LinearRanker,
    NamedFact,
    NearGist,
    NeighbourTurn,
    Recipes,
    RetrievedTurn,
    TurnRecipe,
    facts_named,
    nearest_gists,
    neighbour_turns,
    turns_at,
)
from .timefilter import DateRange, QuestionTime, Window


class ContextDeps(SearchDeps, Protocol):
    """What the builder needs (AnswerDeps has it; the eval harness can build its own)."""

    @property
    def recipes(self) -> Recipes: ...


@dataclass(frozen=True)
class Found:
    """A candidate as its pathway scored it, whether it is about the question's period, and what being
    about it adds to its score (the recipe's ``period_boost``)."""

    candidate: Candidate
    about: bool
    boost: float = PERIOD_BOOST

    @cached_property  # compared and ranked more than once: built once
    def ranked(self) -> Candidate:
        """The candidate as the read ranks it: about the period, boosted."""
        if not self.about:
            return self.candidate
        return self.candidate.plus("period", self.boost)


def best_first(found: Sequence[Found]) -> list[Found]:
    """Each candidate once (its best-scored copy), best first as the read ranks them."""
    by_key: dict[tuple[Any, ...], Found] = {}
    for f in found:
        known = by_key.get(f.candidate.key)
        if known is None or f.ranked.score > known.ranked.score:
            by_key[f.candidate.key] = f
    ranked = {c.key: n for n, c in enumerate(rank(f.ranked for f in by_key.values()))}
    return sorted(by_key.values(), key=lambda f: ranked[f.candidate.key])


def found_turn(candidate: Candidate, when: QuestionTime, said_about: DateRange | None,
               boost: float = PERIOD_BOOST) -> Found:
    """A turn is about the period when it was said in ``said_about`` or a relative date it uses falls in
    the period (its dates are then resolved here, once: packing keeps them)."""
    if said_about is None:
        return Found(candidate, False, boost)
    if said_about.start <= candidate.time < said_about.end:
        return Found(candidate, True, boost)
    if not RELATIVE_PATTERN.search(candidate.text):
        return Found(candidate, False, boost)
    dated = with_dates(candidate)
    return Found(dated, any(when.is_about(p.start, p.end) for p in dated.dates), boost)


def gist_is_about(row: NearGist, when: QuestionTime) -> bool:
    """Whether a gist's event (the days the query's ``gist_days`` gives it) falls in the period."""
    return when.is_about(row.first_day, row.last_day)


def fact_is_about(row: NamedFact, when: QuestionTime) -> bool:
    """Whether a fact held in the period (the days the query's ``fact_days`` gives it); a state question
    also takes an undated statement said before the period's end as holding then."""
    if when.period is None:
        return False
    undated = row.point_in_time is None and row.start_time is None and row.end_time is None
    first = row.first_day or date.min
    last = date.max if row.last_day is None or (undated and when.state) else row.last_day
    period_first, period_last = when.period.range.days  # the period itself: a state that ended before it is not
    return first <= period_last and last >= period_first


def derived(turn: NeighbourTurn, origin: Found, make: Callable[[RetrievedTurn, Candidate, int, float], Candidate],
            share: float, when: QuestionTime, said_about: DateRange | None) -> Found:
    """A turn found through another item (beside a seed, the source of a gist): about the period when
    its origin is, or when it is itself."""
    own = found_turn(make(turn.turn, origin.candidate, turn.seed, share), when, said_about, origin.boost)
    return replace(own, about=own.about or origin.about)


def weighted(found: Found, weight: float) -> Found:
    """A gist or fact at ``weight`` of its fused score (its standing towards the period unchanged)."""
    if weight == 1.0:
        return found
    return replace(found, candidate=replace(found.candidate, score=found.candidate.score * weight))


async def _period_reads(conn: AsyncConnection, found: FoundTurns, question: Question, *, recipe: TurnRecipe,
                        gists: int, facts: int, past: bool,
                        window: Window) -> tuple[list[RetrievedTurn], list[NearGist], list[NamedFact]]:
    """The turns, gists and facts the read finds within the question's period."""
    first, last = window.days
    tenant, conversation_ids = question.tenant, question.conversation_ids
    turns = await best_turns_within(conn, found, tenant=tenant, conversation_ids=conversation_ids, recipe=recipe,
                                    start=window.start, end=window.end)
    gist_rows = await nearest_gists(conn, tenant=tenant, vector=found.vector, conversation_ids=conversation_ids,
                                    limit=gists, first_day=first, last_day=last)
    fact_rows = await facts_named(conn, tenant=tenant, question=question.question, conversation_ids=conversation_ids,
                                  limit=facts, with_superseded=past, first_day=first, last_day=last)
    return turns, gist_rows, fact_rows


@dataclass(frozen=True)
class Gathered:
    """Every candidate the read found (ranked by their pathways' scores, not yet deduplicated), and what
    the learned ranker reads of the question."""

    candidates: list[Candidate]
    asked: Asked

    def ranked(self, ranker: LinearRanker | None, *, budget_tokens: int = CONTEXT_BUDGET_DEFAULT,
               coverage: Coverage = NO_COVERAGE) -> list[Candidate]:
        """Deduplicated, best first: by the pathways' fused scores, then by the ranker when there is one,
        then the head that may fit ``budget_tokens`` re-picked for coverage (consumers/coverage.py) when asked."""
        ranked = rank(self.candidates)
        ranked = ranked if ranker is None else reorder(ranker, ranked, self.asked)
        return cover(ranked, self.asked, budget_tokens, coverage,
                     period_first=ranker is None or ranker.period_first)


async def gather(deps: ContextDeps, question: Question, *, when: QuestionTime, budget_tokens: int,
                 read: ContextRecipe) -> Gathered:
    neighbours, sources, structured, boost = read.neighbours, read.sources, read.structured, read.period_boost
    recipe, gists, facts = read.candidate_counts(budget_tokens, deps.recipes.turns)
    gists = gists if structured.gists or sources.gists else 0  # sources need their gists, shown or not
    facts = facts if structured.facts or sources.facts else 0
    tenant, conversation_ids = question.tenant, question.conversation_ids
    asked = when.asked
    first_day, last_day = asked.days
    about = when.said_about()
    in_period = None if about is None else asked.meet(about)
    async with deps.read_pool.connection() as conn, tenant_scope(conn, tenant):
        found = await best_turns(conn, deps.embedder, tenant=tenant, question=question.question,
                                 conversation_ids=conversation_ids, recipe=recipe, start=asked.start, end=asked.end)
        turns, vector = list(found.turns), found.vector
        gist_lists = [await nearest_gists(conn, tenant=tenant, vector=vector, conversation_ids=conversation_ids,
                                          limit=gists, first_day=first_day, last_day=last_day)]
        fact_lists = [await facts_named(conn, tenant=tenant, question=question.question,
                                        conversation_ids=conversation_ids, limit=facts, with_superseded=when.past,
                                        first_day=first_day, last_day=last_day)]
        if in_period is not None and not in_period.empty:
            # The same searches within the period: what is about it may rank too low in the whole memory.
            period_turns, period_gists, period_facts = await _period_reads(
                conn, found, question, recipe=recipe, gists=gists, facts=facts, past=when.past, window=in_period)
            turns = period_turns + turns
            gist_lists.insert(0, period_gists)
            fact_lists.insert(0, period_facts)
        by_key = {("turn", t.conversation_id, t.turn_id): t for t in turns}
        seeds = best_first([found_turn(turn_candidate(t), when, about, boost) for t in turns])
        seed_turns: list[RetrievedTurn] = [by_key[s.candidate.key] for s in seeds[: neighbours.seeds]]
        beside = await neighbour_turns(conn, tenant=tenant, seeds=seed_turns, each_side=neighbours.each_side,
                                       start=asked.start, end=asked.end)
        gists_found = best_first([Found(gist_candidate(row, n, recipe.rrf_k), gist_is_about(row, when), boost)
                                  for rows in gist_lists for n, row in enumerate(rows, start=1)])
        facts_found = best_first([Found(fact_candidate(row, n, recipe.rrf_k), fact_is_about(row, when), boost)
                                  for rows in fact_lists for n, row in enumerate(rows, start=1)])
        origins = gists_found[: sources.gists] + facts_found[: sources.facts]
        wanted = [(o.candidate.conversation_id, turn_id, n)
                  for n, o in enumerate(origins, start=1) for turn_id in o.candidate.turn_ids]
        sourced = await turns_at(conn, tenant=tenant, wanted=wanted, start=asked.start, end=asked.end)
    everything = (seeds
                  + [derived(n, seeds[n.seed - 1], neighbour_candidate, neighbours.share, when, about) for n in beside]
                  + [derived(s, origins[s.seed - 1], source_candidate, sources.share, when, about) for s in sourced]
                  + [weighted(g, structured.weight) for g in (gists_found if structured.gists else [])]
                  + [weighted(f, structured.weight) for f in (facts_found if structured.facts else [])])
    return Gathered([f.ranked for f in everything], Asked.of(question.question, found.search_text, found.speakers))


async def ranked_memory(question: Question, deps: ContextDeps, recipe: ContextRecipe, *, budget_tokens: int,
                        when: QuestionTime) -> list[Candidate]:
    """Everything the read gathers for ``question``, best first: what the pack takes its prefix of
    (none when the question's time excludes all memory)."""
    if when.asked.empty:
        return []
    gathered = await gather(deps, question, when=when, budget_tokens=budget_tokens, read=recipe)
    return gathered.ranked(recipe.ranker, budget_tokens=budget_tokens, coverage=recipe.coverage)


async def build_context(question: Question, deps: ContextDeps, recipe: ContextRecipe, *,
                        budget_tokens: int = CONTEXT_BUDGET_DEFAULT, when: QuestionTime | None = None) -> MemoryContext:
    """The best memory for ``question`` within its own budget (else ``budget_tokens``; estimate_tokens
    of the text block), ranked best first, as a MemoryContext; no model call (the question is embedded
    here, without the names of the speakers it names). ``when``: the question's time when the caller
    understood it already (else understood here)."""
    started = time.perf_counter()
    budget = check_budget(question.budget_tokens or budget_tokens)
    when = when or QuestionTime.of(question)
    packed = pack(await ranked_memory(question, deps, recipe, budget_tokens=budget, when=when), budget)
    return MemoryContext(
        question_id=question.question_id, tenant=question.tenant, asked_at=when.asked_at, items=packed.items,
        text=packed.text, budget_tokens=budget, used_tokens=packed.used_tokens, time_range=question.time_range,
        resolved=list(when.resolved), past=when.past, latency_ms=round((time.perf_counter() - started) * 1000, 2),
    )


class MetricDeps(ContextDeps, Protocol):
    @property
    def metrics(self) -> Metrics: ...


async def read_context(question: Question, deps: MetricDeps) -> MemoryContext:
    """A `context` question's reply, counted and timed (its latency also in the reply)."""
    context = await build_context(question, deps, deps.recipes.context)
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
