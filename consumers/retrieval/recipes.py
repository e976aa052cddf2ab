"""Retrieval as data: which pathways run, how many candidates each takes from its
index, how they are fused and how many results come back, as frozen recipes with
a few named ones (in the spirit of graphiti_core's search-config recipes).

Pure data: nothing here touches the database.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

from epistream.settings.processes import Settings

from .fragments import TextSearchConfig

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
    match_cap: int = 2_000  # turns BM25's rarest words may find (turns.lexical_turns); 0: every word finds all

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
class Recipes:
    """What the answer worker retrieves with: the router's recipe, fast mode's turns, deep mode's windows."""

    router: SegmentRecipe = ROUTER_DEFAULT
    turns: TurnRecipe = FUSED_TURNS
    windows: WindowRecipe = DEEP_WINDOWS


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
    )
