"""Retrieval as data: which pathways run, how many candidates each takes from its
index, how they are fused and how many results come back, as frozen recipes with
a few named ones (in the spirit of graphiti_core's search-config recipes); the context
read's own tuning (what it reads beside its turns, how deep, what ranks first) is one
of them (``ContextRecipe``).

Pure data: nothing here touches the database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, get_args

from epistream.settings.processes import Settings

from .fragments import TextSearchConfig
from .ranker import LinearRanker, RankerFileError

SegmentPathway = Literal["summary", "dense", "lexical"]
TurnPathway = Literal["dense", "lexical"]
FusionMethod = Literal["minmax", "rrf"]
DeepReads = Literal["windows", "segments"]

SEGMENT_PATHWAYS: tuple[SegmentPathway, ...] = get_args(SegmentPathway)
TURN_PATHWAYS: tuple[TurnPathway, ...] = get_args(TurnPathway)
# The turn pathways of the router take this many turns per segment candidate: a segment holds several turns.
TURNS_PER_SEGMENT_CANDIDATE = 4


def _check(pathways: tuple[str, ...], known: tuple[str, ...]) -> None:
    unknown = [p for p in pathways if p not in known]
    if unknown:
        raise ValueError(f"unknown pathways {unknown}: choose from {known}")


@dataclass(frozen=True)
class TurnRecipe:
    """Fused turn search: each pathway takes its top ``pool`` turns on its own index
    (dense: HNSW; lexical: full-text), their ranks fused by reciprocal rank (``rrf_k``); a turn
    by a speaker the question names gains ``speaker_bonus`` (as much as a rank-20 hit in a third
    pathway at rrf_k 30). Both chosen on the pick split (bench.budget_recall): rrf_k 30 over 60,
    and any bonus from 0.003 to 1 read within 0.01 of each other at 1,000 tokens."""

    pathways: tuple[TurnPathway, ...] = TURN_PATHWAYS
    pool: int = 50
    rrf_k: int = 30
    speaker_bonus: float = 0.02
    top_k: int = 8
    # Turns BM25's rarest words may find (turns.lexical_turns); 0: every word finds all. 1,000, not 2,000: in a
    # 100,000-turn conversation about a fifth faster at unchanged recall; LoCoMo's reads identical (docs/experiments.md).
    match_cap: int = 1_000

    def __post_init__(self) -> None:
        _check(self.pathways, TURN_PATHWAYS)
        if self.match_cap < 0:
            raise ValueError(f"match_cap is 0 (no cap) or more, not {self.match_cap}")


@dataclass(frozen=True)
class SegmentRecipe:
    """The router: which segments to read. Each pathway scores segments on its own index
    (``candidates`` from the summaries, four times as many turns from the turn indexes),
    fused by weighted min-max (``weights``: summary, dense, lexical) or reciprocal rank
    (``rrf_k``); the best ``top_k`` are read, plus any a turn matching every keyword of the
    question force-includes."""

    top_k: int = 5
    candidates: int = 50
    fusion: FusionMethod = "minmax"
    weights: tuple[float, float, float] = (0.3, 0.4, 0.3)
    pathways: tuple[SegmentPathway, ...] = SEGMENT_PATHWAYS
    force_include: bool = True
    rrf_k: int = 30  # one setting (rrf_k) for both recipes; the router fuses by min-max unless asked

    def __post_init__(self) -> None:
        _check(self.pathways, SEGMENT_PATHWAYS)
        if self.fusion not in get_args(FusionMethod):
            raise ValueError(f"fusion must be one of {get_args(FusionMethod)}, not {self.fusion!r}")

    @property
    def turn_candidates(self) -> int:
        return self.candidates * TURNS_PER_SEGMENT_CANDIDATE

    def only(self, pathway: SegmentPathway) -> SegmentRecipe:
        """The same router with a single pathway (ablations, per-pathway recall)."""
        return replace(self, pathways=(pathway,), force_include=self.force_include and pathway == "lexical")


# --- named recipes ------------------------------------------------------------------------

ROUTER_DEFAULT = SegmentRecipe()
ROUTER_RRF = replace(ROUTER_DEFAULT, fusion="rrf")
FUSED_TURNS = TurnRecipe()  # fast mode's turns
DENSE_TURNS = replace(FUSED_TURNS, pathways=("dense",))  # the dense top-k baseline of the eval
# Every OR-ed keyword query (the router's summary and lexical pathways, the tools' "any word") reads
# plainto's lexemes under 'simple', kept as they are: 'english' would stem them again (see
# fragments.any_keyword). The fused turn search's BM25 reads the question's lexemes itself.
KEYWORD_CONFIG: TextSearchConfig = "simple"


@dataclass(frozen=True)
class WindowRecipe:
    """Deep mode's reading windows (consumers/windows.py): ``each_side`` turns around each of the best
    ``seeds`` fused turns, windows sharing a turn merged, at most ``windows`` of them (one assistant
    read each) within ``budget_tokens``. ``reads``: "windows", or E-mem's whole routed "segments"."""

    reads: DeepReads = "windows"
    each_side: int = 3
    windows: int = 5
    budget_tokens: int = 2000
    seeds: int = 40

    def __post_init__(self) -> None:
        if self.reads not in get_args(DeepReads):
            raise ValueError(f"deep reads are one of {get_args(DeepReads)}, not {self.reads!r}")


DEEP_WINDOWS = WindowRecipe()


@dataclass(frozen=True)
class Sources:
    """The source turns of the best ``gists`` gists and of the best ``facts`` facts (entity links: the
    facts about an entity the question names, to the turns they were extracted from), each ranked at
    ``share`` of its origin's score. Measured on the enriched dev split (docs/benchmarks/budget-recall.md)."""

    gists: int = 5
    facts: int = 0
    share: float = 0.9


@dataclass(frozen=True)
class Structured:
    """What enrichment wrote takes part in the read: gists and facts, each ranked at ``weight`` of its
    fused score (0: after every turn of the same standing towards the question's period). Their source
    turns are verbatim and keep their origin's own score (Sources). Ranked last by default: with the
    135M extractor's gists and facts, the enriched report conversation's recall at 4,000 tokens is 0.941
    with them ranked by score and 0.949 with them last, equal below (docs/benchmarks/budget-recall.md);
    a capable extractor may change that, and the eval's context_structured_* rows will show it."""

    gists: bool = True
    facts: bool = True
    weight: float = 0.0


@dataclass(frozen=True)
class Neighbours:
    """The turns beside the best ``seeds`` turn hits (``each_side`` before and after), each ranked at
    ``share`` of its seed's score. Chosen on the pick split (bench.budget_recall's context_* rows): at
    1,000 tokens none 0.716, 3 at 0.95 0.729, 5 at 0.9 0.729, 10 at 0.8 0.742."""

    seeds: int = 10
    each_side: int = 1
    share: float = 0.8


@dataclass(frozen=True)
class Coverage:
    """The coverage step after the learned ranker (consumers/coverage.py, issue 41 item 2): the head of the
    ranking (``window`` times the budget) re-picked greedily by relevance (``1 / (rank_k + place)``, times
    (mean line length / its line length) ** ``length_power``: relevance per token), plus ``aspect_bonus`` per
    question aspect a pick is the first to cover, minus ``day_penalty`` per item already picked from its
    session (day). Off by default (all weights 0: the ranking as it is): no setting of it helped multi-hop or
    open-domain on the report split (docs/benchmarks/budget-recall.md; bench.budget_recall's
    context_coverage row)."""

    aspect_bonus: float = 0.0
    day_penalty: float = 0.0
    rank_k: float = 10.0
    window: float = 2.0
    length_power: float = 0.0

    def __post_init__(self) -> None:
        if self.aspect_bonus < 0 or self.day_penalty < 0 or self.length_power < 0:
            raise ValueError("coverage weights are 0 or more")
        if self.rank_k <= 0 or self.window <= 0:
            raise ValueError("rank_k and window are more than 0")

    @property
    def on(self) -> bool:
        return self.aspect_bonus > 0 or self.day_penalty > 0 or self.length_power > 0


#: Added to the score of memory about the question's period: more than any fused score (two pathways at
#: rank 1 and the speaker bonus stay under 0.1), so it all ranks first, each kind in its own order, and
#: the rest after it, as the read ranked it before.
PERIOD_BOOST = 1.0


@dataclass(frozen=True)
class ContextRecipe:
    """The context read (consumers/context.py): what it reads beside the fused turns (``sources``,
    ``structured``, ``neighbours``), what about the question's period gains (``period_boost``), and how
    deep a budget reads. A turn's line is rarely under ``tokens_per_turn_floor`` tokens (date, speaker, a
    few words): up to ``deep_from`` tokens, the budget over it is how many turns the fused search is asked
    for, beyond it fewer (``depth_exponent``), at most ``max_turn_candidates``, so a larger budget reads
    deeper; gists and facts are asked for one per
    ``tokens_per_structured`` tokens of budget, within ``gist_candidates`` and ``fact_candidates``."""

    sources: Sources = Sources()
    structured: Structured = Structured()
    neighbours: Neighbours = Neighbours()
    coverage: Coverage = Coverage()
    period_boost: float = PERIOD_BOOST
    tokens_per_turn_floor: int = 10
    #: Beyond ``deep_from`` tokens the turns asked for grow as the budget to this power, not in proportion
    #: (1.0): 283 turns at 4,000 tokens, not 400. Recall read the same (report 0.954 either way at 4,000,
    #: pick 0.958 against 0.960) and the 4,000-token read's p95 fell from 54.3 to 44.0 ms
    #: (bench.budget_recall's context_depth_linear row).
    depth_exponent: float = 0.75
    deep_from: int = 1_000
    max_turn_candidates: int = 1_000
    tokens_per_structured: int = 100
    gist_candidates: tuple[int, int] = (5, 100)
    fact_candidates: tuple[int, int] = (10, 100)
    #: The learned ranker that reorders the candidates before packing (consumers/ranking.py); None: the
    #: pathways' fused scores alone (EPISTREAM_CONTEXT_RANKER).
    ranker: LinearRanker | None = None

    def candidate_counts(self, budget_tokens: int, turns: TurnRecipe) -> tuple[TurnRecipe, int, int]:
        """The turn recipe deep enough for the budget, and how many gists and facts to read."""
        depth = -(-min(budget_tokens, self.deep_from) // self.tokens_per_turn_floor)
        if budget_tokens > self.deep_from:
            depth = math.ceil(depth * (budget_tokens / self.deep_from) ** self.depth_exponent)
        top_k = min(self.max_turn_candidates, max(turns.top_k, depth))
        structured = budget_tokens // self.tokens_per_structured
        return (replace(turns, top_k=top_k, pool=max(turns.pool, top_k)),
                min(self.gist_candidates[1], max(self.gist_candidates[0], structured)),
                min(self.fact_candidates[1], max(self.fact_candidates[0], structured)))


CONTEXT_READ = ContextRecipe()


@dataclass(frozen=True)
class Recipes:
    """What the answer worker retrieves with: the router's recipe, fast mode's turns, deep mode's windows,
    the context read's tuning."""

    router: SegmentRecipe = ROUTER_DEFAULT
    turns: TurnRecipe = FUSED_TURNS
    windows: WindowRecipe = DEEP_WINDOWS
    context: ContextRecipe = CONTEXT_READ


def from_settings(settings: Settings) -> Recipes:
    """The named defaults with the router_*, retrieve_* and deep_* settings applied (the one place that reads them)."""
    return Recipes(
        router=replace(ROUTER_DEFAULT, top_k=settings.router_top_k, candidates=settings.router_candidates,
                       fusion=settings.router_fusion, weights=settings.pathway_weights,
                       force_include=settings.router_force_include, rrf_k=settings.rrf_k),
        turns=replace(FUSED_TURNS, top_k=settings.retrieve_top_k, pool=settings.retrieve_pool,
                      rrf_k=settings.rrf_k, speaker_bonus=settings.speaker_bonus,
                      match_cap=settings.lexical_match_cap),
        windows=replace(DEEP_WINDOWS, reads=settings.deep_reads, each_side=settings.deep_window_turns,
                        windows=settings.deep_windows, budget_tokens=settings.deep_read_tokens),
        context=replace(CONTEXT_READ, ranker=context_ranker(settings)),  # else bench.budget_recall's variants
    )


def context_ranker(settings: Settings) -> LinearRanker | None:
    """The ranker EPISTREAM_CONTEXT_RANKER names (its file checked when the settings were read), loaded."""
    path = settings.context_ranker_path
    if path is None:
        return None
    try:
        return LinearRanker.load(path)
    except RankerFileError as exc:
        raise RankerFileError(f"EPISTREAM_CONTEXT_RANKER: {exc}") from None
