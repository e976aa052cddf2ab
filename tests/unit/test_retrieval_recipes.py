"""The retrieval package's pure parts: recipes as data (and from settings), the fusion
maths, and the SQL its fragments compose (each fragment written once)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from psycopg import sql

from epistream.consumers.retrieval import (
    CONTEXT_READ,
    DENSE_TURNS,
    FUSED_TURNS,
    SEGMENT_PATHWAYS,
    LinearRanker,
    Recipes,
    SegmentRecipe,
    TurnRecipe,
    from_settings,
    fuse,
    reciprocal_rank,
)
from epistream.consumers.retrieval.fragments import any_keyword, in_scope, overlaps_window, turns_by_id
from epistream.consumers.retrieval.fusion import min_max
from epistream.consumers.retrieval.recipes import KEYWORD_CONFIG, ROUTER_DEFAULT, ROUTER_RRF
from epistream.consumers.retrieval.seeds import LEXICAL_GISTS, LEXICAL_TURNS
from epistream.consumers.retrieval.segments import DENSE_PATHWAY, lexical_pathway, summary_pathway
from epistream.consumers.retrieval.turns import fused_turn_search
from epistream.settings import ranker_cards
from epistream.settings.processes import Settings

ROOT = Path(__file__).resolve().parents[2]


def text(composed: sql.Composable) -> str:
    return composed.as_string(None)


# --- recipes ------------------------------------------------------------------------------

def test_named_recipes_are_the_defaults_the_worker_used():
    assert ROUTER_DEFAULT == SegmentRecipe(top_k=5, candidates=50, fusion="minmax", weights=(0.3, 0.4, 0.3),
                                           pathways=("summary", "dense", "lexical"), force_include=True, rrf_k=30)
    assert ROUTER_DEFAULT.turn_candidates == 200
    assert ROUTER_RRF == replace(ROUTER_DEFAULT, fusion="rrf")
    assert FUSED_TURNS == TurnRecipe(pathways=("dense", "lexical"), pool=50, rrf_k=30, top_k=8, speaker_bonus=0.02)
    assert DENSE_TURNS.pathways == ("dense",) and DENSE_TURNS.pool == FUSED_TURNS.pool
    assert KEYWORD_CONFIG == "simple"


def test_recipes_come_from_the_router_and_retrieve_settings():
    settings = Settings(router_top_k=3, router_candidates=20, router_fusion="rrf", router_weights=(0.2, 0.5, 0.3),
                        router_force_include=False, retrieve_top_k=11, retrieve_pool=70, rrf_k=40,
                        speaker_bonus=0.5, lexical_match_cap=300)
    recipes = from_settings(settings)
    assert recipes == Recipes(
        router=SegmentRecipe(top_k=3, candidates=20, fusion="rrf", weights=(0.2, 0.5, 0.3), force_include=False,
                             rrf_k=40),
        turns=TurnRecipe(top_k=11, pool=70, rrf_k=40, speaker_bonus=0.5, match_cap=300),
        context=BUILTIN_READ,
    )
    assert recipes.router.turn_candidates == 80


def test_default_settings_give_the_named_recipes():
    fields = ("router_top_k", "router_candidates", "router_fusion", "router_weights", "router_force_include",
              "retrieve_top_k", "retrieve_pool", "rrf_k", "speaker_bonus", "lexical_match_cap")
    defaults = Settings(**{f: Settings.model_fields[f].default for f in fields})
    assert from_settings(defaults) == Recipes(router=ROUTER_DEFAULT, turns=FUSED_TURNS, context=BUILTIN_READ)


#: The context read as the settings give it by default: the named recipe with the shipped ranker.
BUILTIN_READ = replace(CONTEXT_READ, ranker=LinearRanker.load(ranker_cards.BUILTIN.path))


def test_one_pathway_keeps_force_include_only_for_lexical():
    assert ROUTER_DEFAULT.only("dense") == replace(ROUTER_DEFAULT, pathways=("dense",), force_include=False)
    assert ROUTER_DEFAULT.only("lexical").force_include
    assert not replace(ROUTER_DEFAULT, force_include=False).only("lexical").force_include


@pytest.mark.parametrize("bad", [
    lambda: SegmentRecipe(pathways=("summary", "graph")),
    lambda: SegmentRecipe(fusion="max"),
    lambda: TurnRecipe(pathways=("summary",)),
])
def test_a_recipe_naming_what_does_not_exist_fails_when_built(bad):
    with pytest.raises(ValueError):
        bad()


# --- fusion -------------------------------------------------------------------------------

SCORES = {"summary": {"a": 0.9, "b": 0.5}, "dense": {"a": 0.2, "b": 0.8, "c": 0.8}, "lexical": {"c": 3.0}}


def test_min_max_scales_to_unit_and_counts_a_flat_pathway_as_one():
    assert min_max({"a": 2.0, "b": 4.0, "c": 3.0}) == {"a": 0.0, "b": 1.0, "c": 0.5}
    assert min_max({"a": 7.0, "b": 7.0}) == {"a": 1.0, "b": 1.0}


def test_weighted_min_max_fusion():
    fused = fuse(SCORES, ROUTER_DEFAULT)
    assert fused == pytest.approx({"a": 0.3, "b": 0.3 * 0 + 0.4 * 1, "c": 0.4 * 1 + 0.3 * 1})


def test_reciprocal_rank_fusion_breaks_ties_by_id():
    fused = fuse(SCORES, replace(ROUTER_RRF, rrf_k=10))
    # dense: b and c tie on 0.8, b ranks first by id
    assert fused["b"] == pytest.approx(reciprocal_rank(2, 10) + reciprocal_rank(1, 10))
    assert fused["c"] == pytest.approx(reciprocal_rank(2, 10) + reciprocal_rank(1, 10))
    assert fused["a"] == pytest.approx(1 / 11 + 1 / 13)
    assert reciprocal_rank(1, 60) == 1 / 61


def test_only_the_recipes_pathways_are_fused():
    assert set(fuse(SCORES, ROUTER_DEFAULT.only("lexical"))) == {"c"}
    assert fuse({p: {} for p in SEGMENT_PATHWAYS}, ROUTER_DEFAULT) == {}


# --- fragments ----------------------------------------------------------------------------

OR_QUERY = "to_tsquery('{}', replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | '))"


def test_the_or_query_is_one_fragment_parameterised_by_its_text_search_config():
    assert text(any_keyword("english")) == OR_QUERY.format("english")
    assert text(any_keyword("simple")) == OR_QUERY.format("simple")
    with pytest.raises(ValueError):
        any_keyword("english'); DROP TABLE memory.turns; --")  # type: ignore[arg-type]


def test_each_caller_reads_the_or_query_under_the_config_it_always_used():
    for router_statement in (summary_pathway("english"), lexical_pathway("english")):
        assert OR_QUERY.format("english") in text(router_statement)
    for tool_statement in (LEXICAL_GISTS, LEXICAL_TURNS):
        assert OR_QUERY.format("simple") in text(tool_statement)
    # BM25 weighs and matches the same lexemes word by word, each read as it is ('simple').
    assert "plainto_tsquery('simple', w.lexeme)" in text(fused_turn_search())


def test_scope_is_the_tenant_and_the_question_conversations():
    assert text(in_scope("t")) == ('"t"."tenant" = %(tenant)s AND (%(conversations)s::text[] IS NULL '
                                   'OR "t"."conversation_id" = ANY(%(conversations)s))')


def test_the_time_window_is_one_fragment_over_instants_or_days():
    instant = overlaps_window(sql.SQL("s.start_ts"), sql.SQL("s.end_ts"), "instant")
    assert text(instant) == ("(%(start)s::timestamptz IS NULL OR s.end_ts >= %(start)s)"
                             " AND (%(end)s::timestamptz IS NULL OR s.start_ts < %(end)s)")
    day = overlaps_window(sql.SQL("d"), sql.SQL("d"), "day")
    assert text(day) == "(%(start)s::date IS NULL OR d >= %(start)s) AND (%(end)s::date IS NULL OR d <= %(end)s)"
    assert text(overlaps_window(sql.SQL("t.ts"), sql.SQL("t.ts"), "instant")) in text(DENSE_PATHWAY)


def test_turns_by_id_in_time_order_or_as_listed():
    by_time = text(turns_by_id("time"))
    assert "t.turn_id = ANY(%(turn_ids)s)" in by_time and by_time.endswith("ORDER BY t.ts, t.turn_id")
    listed = text(turns_by_id("listed"))
    assert "WITH ORDINALITY" in listed and listed.endswith("ORDER BY ids.position")
    for statement in (by_time, listed):
        assert statement.startswith('SELECT "t"."conversation_id", "t"."turn_id", "t"."speaker", "t"."text", "t"."ts"')


def test_the_query_side_reads_turns_and_keyword_queries_only_through_the_retrieval_package():
    outside = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "consumers").rglob("*.py")
        if "retrieval" not in path.relative_to(ROOT / "consumers").parts
        and any(marker in path.read_text() for marker in ("memory.turns", "to_tsquery", "= ANY(%(conversations)s"))
    ]
    assert outside == []


def test_the_hnsw_search_is_twice_as_wide_as_the_pool_it_fills_within_pgvectors_bounds():
    from epistream.consumers.retrieval.turns import EF_SEARCH_DEFAULT, EF_SEARCH_MAX, search_width

    assert search_width(8) == EF_SEARCH_DEFAULT
    assert search_width(100) == 200
    assert search_width(5_000) == EF_SEARCH_MAX
